"""``OTelTracer``: a run's steps as OpenTelemetry spans, per the GenAI semantic conventions.

::

    invoke_agent <agent>           INTERNAL  the run: gen_ai.agent.name, conversation id, usage
      chat <model>                 CLIENT    one model call attempt: provider, request and
                                             response model, usage, finish reasons

Usage is ``gen_ai.usage.input_tokens`` and ``output_tokens``, and where the provider reports
them ``gen_ai.usage.cache_read.input_tokens``, ``cache_creation.input_tokens`` and
``reasoning.output_tokens``.
      execute_tool <tool>          INTERNAL  one tool call: gen_ai.tool.name, gen_ai.tool.call.id
      (events on the run span)               confirmation_requested, confirmation_resolved

Only ``opentelemetry-api`` is imported. Spans go to whatever tracer provider the host installed
(the API's default is a no-op one); ``app`` installs the SDK and an OTLP exporter when the
standard ``OTEL_*`` variables ask for it. The run's span takes its parent from the current
context where the run was started, so a host that attached an incoming ``traceparent`` gets the
run in the caller's trace.

Prompts, answers, system instructions and tool arguments and results are recorded only with
``capture_content=True``: they are what users typed and what tools returned. Even then an image
or a document is recorded by its reference (or URL) and media type, never its bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from ..content import MediaPart, TextPart
from ..errors import ConfigurationError
from ..events import AgentEvent
from ..extensions.base import ToolOutcome
from ..messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from ..model import ModelRequest, ModelResponse, Usage
from ..tracing import ModelCallTrace, RunTracer, ToolCallTrace

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the dependency ships with the project
    raise ConfigurationError(
        "agent_runtime.integrations.otel needs the OpenTelemetry API: pip install opentelemetry-api"
    ) from exc

if TYPE_CHECKING:
    from ..agent import AgentRunContext
    from ..bindings import ModelBinding

__all__ = ["OTelTracer"]

_SCOPE = "agent_runtime"

# the confirmation payload fields that are identifiers, not content
_EVENT_FIELDS = {
    "tool_call_id": "gen_ai.tool.call.id",
    "tool": "gen_ai.tool.name",
    "outcome": "agent_runtime.confirmation.outcome",
    "expires_at": "agent_runtime.confirmation.expires_at",
}


def _media(part: MediaPart) -> dict[str, Any]:
    """An image or a document by its reference or URL and its type, never its bytes."""
    described: dict[str, Any] = {"modality": part.kind, "mime_type": part.media_type}
    if part.ref is not None:
        return {"type": "file", "file_id": part.ref, **described}
    if part.url is not None and not part.url.startswith("data:"):
        return {"type": "uri", "uri": part.url, **described}
    # bytes not stored yet, or a data: URL: their size at most
    size = part.size if part.size is not None else len(part.data or b"") or None
    return {"type": "blob", "size": size, **described}


def _parts(message: Message) -> dict[str, Any]:
    """A message in the conventions' shape: a role and a list of typed parts."""
    parts: list[dict[str, Any]] = []
    if isinstance(message, ToolMessage):
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
        parts.extend(_media(p) for p in message.parts)
        return {"role": "tool", "parts": parts}
    if isinstance(message, UserMessage):
        for part in message.parts:
            if isinstance(part, TextPart):
                if part.text:
                    parts.append({"type": "text", "content": part.text})
            else:
                parts.append(_media(part))
        return {"role": "user", "parts": parts}
    if message.content:
        parts.append({"type": "text", "content": message.content})
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            parts.append(
                {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
            )
    return {"role": message.role, "parts": parts}


# the semantic conventions' names of a usage's counts; a detail only where it was reported
_USAGE_DETAILS = (
    ("cached_input_tokens", "gen_ai.usage.cache_read.input_tokens"),
    ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
    ("reasoning_tokens", "gen_ai.usage.reasoning.output_tokens"),
)


def _set_usage(span: Span, usage: Usage) -> None:
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    for field_name, attribute in _USAGE_DETAILS:
        value = getattr(usage, field_name)
        if value is not None:
            span.set_attribute(attribute, value)


def _messages_json(messages: Sequence[Message]) -> str:
    return json.dumps([_parts(m) for m in messages], ensure_ascii=False, default=str)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _fail(span: Span, error: BaseException) -> None:
    code = getattr(error, "code", None)
    span.set_attribute("error.type", code if isinstance(code, str) else type(error).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))


class _ModelCall(ModelCallTrace):
    __slots__ = ("_capture", "_span")

    def __init__(self, span: Span, capture: bool) -> None:
        self._span = span
        self._capture = capture

    def response(self, response: ModelResponse) -> None:
        span = self._span
        if not span.is_recording():
            return
        usage = response.usage
        if usage is not None:
            _set_usage(span, usage)
            if usage.model:
                span.set_attribute("gen_ai.response.model", usage.model)
        if response.stop_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason])
        if self._capture:
            span.set_attribute("gen_ai.output.messages", _messages_json([response.message]))


class _ToolCall(ToolCallTrace):
    __slots__ = ("_capture", "_span")

    def __init__(self, span: Span, capture: bool) -> None:
        self._span = span
        self._capture = capture

    def outcome(self, outcome: ToolOutcome, *, refused: bool) -> None:
        span = self._span
        if not span.is_recording():
            return
        if outcome.is_error:
            span.set_attribute("error.type", "tool_refused" if refused else "tool_error")
            # the error text can quote the arguments: a description only with content on
            span.set_status(Status(StatusCode.ERROR, outcome.error if self._capture else None))
            if self._capture and outcome.error is not None:
                span.set_attribute("gen_ai.tool.call.result", outcome.error)
        elif self._capture:
            span.set_attribute("gen_ai.tool.call.result", _json(outcome.result))


class OTelTracer(RunTracer):
    """Spans for runs, model calls and tool calls (see the module docstring).

    Args:
        tracer_provider: where the spans go; default the global one (``trace.set_tracer_provider``).
        capture_content: also record prompts, answers, system instructions and tool arguments
            and results (``gen_ai.input.messages`` and the like). Off by default.
    """

    def __init__(
        self, *, tracer_provider: trace.TracerProvider | None = None, capture_content: bool = False
    ) -> None:
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self._runs: dict[str, Span] = {}

    def run_span_context(self, run_id: str) -> SpanContext | None:
        """The span context of a run in progress here, for a host that links to it."""
        span = self._runs.get(run_id)
        return span.get_span_context() if span is not None else None

    def run(self, context: AgentRunContext, prompt: str) -> AbstractContextManager[None]:
        return self._run(context, prompt)

    @contextmanager
    def _run(self, context: AgentRunContext, prompt: str) -> Iterator[None]:
        name = context._options.agent_name or context.agent.name
        primary = context.agent.bindings.llm[0]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "gen_ai.conversation.id": context.session_id,
            "gen_ai.provider.name": primary.provider_name,
            "gen_ai.system": primary.provider_name,
            "gen_ai.request.model": primary.model,
            "agent_runtime.run.id": context.run_id,
        }
        if self.capture_content:
            attributes["gen_ai.input.messages"] = json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": prompt}]}],
                ensure_ascii=False,
            )
        span = self._tracer.start_span(
            f"invoke_agent {name}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._runs[context.run_id] = span
        try:
            with trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield
        except asyncio.CancelledError:
            reason = context._cancel_reason or "cancelled"
            span.set_attribute("agent_runtime.run.cancel_reason", reason)
            raise
        except Exception as error:
            _fail(span, error)
            raise
        else:
            span.set_status(Status(StatusCode.OK))
            if self.capture_content:
                answer = [m for m in context.state.added if isinstance(m, AssistantMessage)]
                if answer:
                    span.set_attribute("gen_ai.output.messages", _messages_json(answer[-1:]))
        finally:
            self._runs.pop(context.run_id, None)
            _set_usage(span, context.state.usage)
            span.end()

    def model_call(
        self, context: AgentRunContext, binding: ModelBinding, request: ModelRequest
    ) -> AbstractContextManager[ModelCallTrace]:
        return self._model_call(context, binding, request)

    @contextmanager
    def _model_call(
        self, context: AgentRunContext, binding: ModelBinding, request: ModelRequest
    ) -> Iterator[ModelCallTrace]:
        provider = binding.provider_name
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": binding.model,
            "gen_ai.conversation.id": context.session_id,
            "agent_runtime.model_call.id": request.model_call_id,
        }
        if self.capture_content:
            attributes["gen_ai.input.messages"] = _messages_json(request.messages)
            if request.system:
                attributes["gen_ai.system_instructions"] = json.dumps(
                    [{"type": "text", "content": request.system}], ensure_ascii=False
                )
        with self._tracer.start_as_current_span(
            f"chat {binding.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield _ModelCall(span, self.capture_content)
            except Exception as error:
                _fail(span, error)
                reason = getattr(error, "reason", None)
                if isinstance(reason, str):
                    span.set_attribute("agent_runtime.error.reason", reason)
                raise

    def tool_call(
        self, context: AgentRunContext, call: ToolCall
    ) -> AbstractContextManager[ToolCallTrace]:
        return self._tool_call(context, call)

    @contextmanager
    def _tool_call(self, context: AgentRunContext, call: ToolCall) -> Iterator[ToolCallTrace]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _json(call.arguments)
        with self._tracer.start_as_current_span(
            f"execute_tool {call.name}",
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield _ToolCall(span, self.capture_content)
            except Exception as error:
                _fail(span, error)
                raise

    def event(self, context: AgentRunContext, event: AgentEvent) -> None:
        span = self._runs.get(context.run_id)
        if span is None or not span.is_recording():
            return
        payload = event.payload or {}
        attributes: dict[str, Any] = {}
        for key, value in payload.items():
            named = _EVENT_FIELDS.get(key)
            if named is not None and isinstance(value, str | int | float | bool):
                attributes[named] = value
            elif self.capture_content:
                attributes[f"agent_runtime.payload.{key}"] = _json(value)
        span.add_event(event.name or "custom", attributes=attributes)
