"""One model call of a run: streamed to the run's channel, retried on the same binding, failed
over to the next one.

``ModelCalls`` is held by ``AgentCore`` (``agent_runtime.agent``), one per agent. A retryable
``ProviderError`` before any text of the call reached the consumer moves on (after the
binding's own ``RetryOptions``); after the first delta, or a non-retryable error, the run fails.

Before each try the conversation is fitted to what the binding's model takes
(``agent_runtime.input_kinds``). A binding that cannot take an image or a document of a user
message is passed over, nothing sent to it, for the next one that can (a vision model as the
fallback of a text-only one answers such a call); when no binding can, the call fails with the
first binding's ``UnsupportedContentError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ProviderError, UnsupportedContentError
from .events import AgentEvent, AgentEventType
from .input_kinds import declared_input_kinds, fit_messages
from .model import (
    Model,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    RetryOptions,
    Usage,
)
from .run_context import AgentRunContext, new_id

if TYPE_CHECKING:
    from .bindings import ModelBinding, ModelBindings
    from .content import ContentStore
    from .messages import AssistantMessage
    from .tracing import RunTracer

__all__ = ["ModelCalls"]

logger = logging.getLogger("agent_runtime")

_DEFAULT_RETRY = RetryOptions()


class ModelCalls:
    """The model calls of an agent's runs, on its bindings, told to its tracer."""

    __slots__ = ("_bindings", "_tracer")

    def __init__(self, bindings: ModelBindings, tracer: RunTracer) -> None:
        self._bindings = bindings
        self._tracer = tracer

    async def turn(
        self,
        context: AgentRunContext,
        *,
        system: str | None,
        output_schema: OutputSchema | None,
        content_store: ContentStore | None,
        cache_key: str | None,
    ) -> AssistantMessage:
        """The run's next model call on its conversation so far: the model's message."""
        options = context._options
        skills = options.skill_state
        # read each time: a skill activated by the last batch narrows what is advertised
        if skills is not None:
            specs = skills.advertised(options.tools)
        else:
            specs = [t.spec for t in options.tools.values()]
        request = ModelRequest(
            messages=list(context.state.messages),
            tools=specs,
            system=system,
            run_id=context.run_id,
            session_id=context.session_id,
            params=options.params,
            output_schema=output_schema,
            content_store=content_store,
            cache_key=cache_key,
        )
        return (await self.call(context, request)).message

    async def call(self, context: AgentRunContext, request: ModelRequest) -> ModelResponse:
        """One model call, with retries on the same binding and failover to the next one."""
        gate = context._options.model_gate
        if gate is not None:
            await gate(context)  # its RunError fails the run before the call is made
        run_id = context.run_id
        last_error: ProviderError | None = None
        refused: UnsupportedContentError | None = None
        for binding in self._bindings.llm:
            attempt = 0
            while True:
                model_call_id = new_id("mcall")
                request.model_call_id = model_call_id
                progress = _Attempt(model_call_id)
                try:
                    response = await self._attempt(context, binding, request, progress)
                except UnsupportedContentError as exc:
                    exc.run_id = run_id
                    if progress.emitted:
                        raise
                    # nothing was sent: the next binding may take what this one cannot
                    refused = refused or exc
                    logger.info(
                        "model binding cannot take the conversation's content, trying the next",
                        extra={"run_id": run_id, "model": binding.model, "kind": exc.kind},
                    )
                    break
                except ProviderError as exc:
                    exc.run_id = run_id
                    if progress.emitted or not exc.retryable:
                        raise
                    last_error = exc
                    attempt += 1
                    if attempt <= progress.retry.max_retries:
                        await asyncio.sleep(progress.retry.delay(attempt, exc.retry_after))
                        continue
                    logger.warning(
                        "model binding failed, trying the next one",
                        extra={"run_id": run_id, "model": binding.model, "status": exc.status_code},
                    )
                    break
                # the answer is whole: it joins the conversation, its text is no longer partial
                context.state.partial.clear()
                context.state.partial_reasoning.clear()
                if response.usage is not None:
                    await _report_usage(context, binding, response.usage, model_call_id)
                return response
        if last_error is not None:
            raise last_error
        assert refused is not None
        raise refused

    async def _attempt(
        self,
        context: AgentRunContext,
        binding: ModelBinding,
        request: ModelRequest,
        progress: _Attempt,
    ) -> ModelResponse:
        """One try on one binding: its text streamed to the run's channel as it comes."""
        response: ModelResponse | None = None
        with self._tracer.model_call(context, binding, request) as trace:
            async with binding.lease_provider() as provider:
                progress.retry = getattr(provider, "retry", None) or _DEFAULT_RETRY
                stream = provider.stream(_fitted(request, binding, provider))
                try:
                    async for item in stream:
                        kind = item.kind
                        if kind is ModelEventKind.TEXT:
                            if item.delta:
                                progress.emitted = True
                                context.state.partial.append(item.delta)
                                await context._channel.put(
                                    AgentEvent(
                                        AgentEventType.TEXT_DELTA,
                                        context.run_id,
                                        context.session_id,
                                        progress.model_call_id,
                                        delta=item.delta,
                                    )
                                )
                        elif kind is ModelEventKind.REASONING:
                            if item.delta:
                                progress.emitted = True
                                context.state.partial_reasoning.append(item.delta)
                                await context._channel.put(
                                    AgentEvent(
                                        AgentEventType.REASONING_DELTA,
                                        context.run_id,
                                        context.session_id,
                                        progress.model_call_id,
                                        delta=item.delta,
                                    )
                                )
                        elif kind is ModelEventKind.COMPLETED:
                            response = item.response
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:
                        await aclose()
            if response is None:
                raise ProviderError(
                    f"model {binding.model} ended its stream without a completed event"
                )
            trace.response(response)
        return response


def _fitted(request: ModelRequest, binding: ModelBinding, provider: Model) -> ModelRequest:
    """``request`` as this binding's model can take it; UnsupportedContentError if it cannot."""
    kinds = declared_input_kinds(provider)
    if binding.input_kinds is not None:
        kinds &= binding.input_kinds
    messages = fit_messages(
        request.messages, kinds, model=binding.model, provider=binding.provider_name
    )
    if messages is request.messages:
        return request
    return dataclasses.replace(request, messages=list(messages))


@dataclass
class _Attempt:
    """One try: its model call's id, whether text reached the consumer, the retry options."""

    model_call_id: str
    emitted: bool = False
    retry: RetryOptions = _DEFAULT_RETRY


async def _report_usage(
    context: AgentRunContext, binding: ModelBinding, reported: Usage, model_call_id: str
) -> None:
    # the binding that answered, which after a failover is not the primary; the cache and
    # reasoning counts go on as reported
    usage = dataclasses.replace(reported, model=reported.model or binding.model)
    context.state.usage.add(usage)
    await context._channel.put(
        AgentEvent(
            AgentEventType.USAGE,
            context.run_id,
            context.session_id,
            model_call_id,
            usage=usage,
            model=usage.model,
        )
    )
