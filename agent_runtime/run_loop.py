"""A run's life inside ``AgentCore``: its task, from the first hook to its terminal event.

``RunLoop._execute`` is the body of every run's task: the run's hooks and conversation, then
model call and tool calls in turn until the model answers without calling a tool (or the
run's iterations, its tool errors or its deadline run out), then the run's end: its turn
stored, the extensions told, and exactly one terminal event put on its channel, whatever
happened (completed, failed, cancelled). ``AgentCore`` mixes it in; the attributes named in
the class body are the core's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from .bindings import ModelBindings
from .checkpoints import RunCheckpoint
from .compaction import prepare_context
from .content import ContentStore, Prompt, content_text, store_parts
from .conversation import ConversationStore
from .deadlines import RunDeadline
from .errors import (
    ConfigurationError,
    MaxIterationsError,
    RunError,
    RunTimeoutError,
    ToolErrorLimitError,
)
from .events import AgentEvent, AgentEventType, AgentPhase
from .extensions.base import AgentExtension
from .extensions.events import RunCancelledEvent
from .messages import AssistantMessage, UserMessage
from .model_calls import ModelCalls
from .run_context import HANDOVER, AgentRunContext
from .run_setup import first_event, prompt_cache_key, system_prompt
from .skills.activation import SkillState
from .structured import StructuredOutput, check_answer
from .tool_calls import ToolCalls
from .tracing import RunTracer

__all__ = ["RunLoop"]

logger = logging.getLogger("agent_runtime")


class RunLoop:
    """The run's task, mixed into ``AgentCore`` (see the module docstring)."""

    bindings: ModelBindings
    content_store: ContentStore
    conversation_store: ConversationStore | None
    tracer: RunTracer
    tool_error_limit: int
    max_history_messages: int | None
    _extensions: list[AgentExtension]
    _model_calls: ModelCalls
    _tool_calls: ToolCalls
    _runs: dict[str, AgentRunContext]
    _sessions: dict[str, str]

    async def _execute(self, context: AgentRunContext, prompt: Prompt) -> None:
        state = context.state
        options = context._options
        channel = context._channel
        try:
            with self.tracer.run(context, content_text(prompt)):
                try:
                    # the loop's shared deadlines, not a timer each: a run may wait for hours
                    with RunDeadline(options.run_timeout) as deadline:
                        await self._run_loop(context, prompt)
                except TimeoutError as exc:
                    if deadline.expired():
                        raise RunTimeoutError(
                            options.run_timeout or 0.0, run_id=context.run_id
                        ) from exc
                    raise
        except asyncio.CancelledError:
            state.phase = AgentPhase.CANCELLED
            reason = context._cancel_reason or "cancelled"
            await self._notify_cancelled(context, reason)
            channel.put_nowait(
                AgentEvent(
                    AgentEventType.RUN_CANCELLED,
                    context.run_id,
                    context.session_id,
                    usage=state.usage,
                    # handed over: the run goes on elsewhere, so it leaves no stopped turn
                    messages=[] if reason == HANDOVER else state.stopped_messages(),
                    reason=reason,
                )
            )
            channel.close()
            raise
        except Exception as error:
            if isinstance(error, RunError) and error.run_id is None:
                error.run_id = context.run_id
            state.phase = AgentPhase.FAILED
            state.error = error
            await self._notify_error(context, error)
            channel.put_nowait(
                AgentEvent(
                    AgentEventType.RUN_FAILED,
                    context.run_id,
                    context.session_id,
                    error_code=getattr(error, "code", "internal"),
                    error=str(error),
                    usage=state.usage,
                    # a finer class of the failure (ProviderError: "malformed_response")
                    reason=getattr(error, "reason", None),
                )
            )
            channel.close()
            raise
        else:
            channel.close()
        finally:
            self._runs.pop(context.run_id, None)
            if self._sessions.get(context.session_id) == context.run_id:
                del self._sessions[context.session_id]

    async def _run_loop(self, context: AgentRunContext, prompt: Prompt) -> None:
        state = context.state
        options = context._options
        channel = context._channel
        await self._start_run(context, prompt)
        skills = options.skill_state
        if skills is not None:
            await self._add_skill_tools(context, skills, content_text(prompt))
        system = system_prompt(options)
        output = options.output
        structured: StructuredOutput | None = None
        resume = options.resume
        answers = resume.structured_answers if resume is not None else 0
        checkpoints = context._checkpoints
        new_messages = state.added
        cache_key = prompt_cache_key(options, context.session_id)
        if resume is not None and resume.calls:
            await self._finish_open_calls(context, resume)
        while True:
            if state.iteration >= options.max_iterations:
                raise _max_iterations(context)
            state.iteration += 1
            state.phase = AgentPhase.MODEL
            state.messages = await prepare_context(
                state.messages,
                compactor=options.context_compactor,
                max_messages=self.max_history_messages,
                run_id=context.run_id,
            )
            # the request is built and dropped in there: a run waiting for an answer
            # afterwards keeps none of it (each tool's spec is built once, by the tool)
            message = await self._model_calls.turn(
                context,
                system=system,
                output_schema=output.schema if output is not None else None,
                content_store=self.content_store,
                cache_key=cache_key,
            )
            state.messages.append(message)
            if not message.tool_calls and output is not None:
                answers += 1
                structured = await check_answer(
                    output,
                    message,
                    answers,
                    run_id=context.run_id,
                    conversation=context.state.messages,
                )
                if structured is None:
                    if checkpoints is not None:
                        checkpoints.structured_answers = answers
                    continue
            new_messages.append(message)
            if checkpoints is not None:
                checkpoints.structured_answers = answers
                checkpoints.open(message.tool_calls)
                await checkpoints.save(new_messages, state.iteration, state.usage)
            if not message.tool_calls:
                break
            state.phase = AgentPhase.TOOLS
            # tools have side effects: run them only once the consumer has seen the calls
            # coming, so a consumer that already left cancels instead
            await channel.wait_consumer_idle()
            results = await self._tool_calls.run(context, message.tool_calls)
            state.messages.extend(results)
            new_messages.extend(results)
            if checkpoints is not None:
                checkpoints.close()
            if state.consecutive_tool_errors >= self.tool_error_limit:
                raise _tool_error_limit(context)
        await self._complete_run(context, message, structured)

    async def _start_run(self, context: AgentRunContext, prompt: Prompt) -> None:
        """The run's hooks, its conversation so far, and its first event (started or resumed)."""
        state = context.state
        options = context._options
        state.phase = AgentPhase.STARTING
        for extension in self._extensions:
            await extension.before_run(context)
        for extension in self._extensions:
            await extension.on_tool(context)
        if options.conversation is not None:
            # read once: the run's messages hold it from here (a copy would live as long)
            history, options.conversation = options.conversation, None
        elif self.conversation_store is not None:
            history = await self.conversation_store.load(context.session_id)
        else:
            history = []
        resume = options.resume
        if resume is None:
            if not isinstance(prompt, str):  # bytes go to the store, the message holds refs
                prompt = await store_parts(prompt, self.content_store, context.session_id)
            user = UserMessage(prompt)
            state.messages = [*history, user]
            state.added.append(user)
        else:
            # the run's own part of the conversation is put back after what came before it
            state.messages = [*history, *resume.added]
            state.added.extend(resume.added)
            state.iteration = resume.iteration
            state.usage = dataclasses.replace(resume.usage)
        await context._channel.put(first_event(context, self.bindings.llm[0].model))

    async def _add_skill_tools(
        self, context: AgentRunContext, skills: SkillState, prompt: str
    ) -> None:
        """Start the run's skills and add their tools to the run's own."""
        options = context._options
        await skills.start(context, prompt)
        for name, built in skills.tools().items():
            if options.tool_filter is not None and not options.tool_filter(built):
                continue  # the run's filter reaches the skill tools too
            if name in options.tools:
                raise ConfigurationError(
                    f"tool {name!r} collides with the skill tool of that name; rename it"
                )
            options.add_tool(name, built)

    async def _finish_open_calls(self, context: AgentRunContext, resume: RunCheckpoint) -> None:
        """A resumed run's open calls: those of its last model response without a result."""
        state = context.state
        results = await self._tool_calls.resume(context, resume)
        state.messages.extend(results)
        state.added.extend(results)
        checkpoints = context._checkpoints
        if checkpoints is not None:
            checkpoints.close()
            await checkpoints.save(state.added, state.iteration, state.usage)

    async def _complete_run(
        self,
        context: AgentRunContext,
        message: AssistantMessage,
        structured: StructuredOutput | None,
    ) -> None:
        """Store the run's turn, tell the extensions, and put ``run.completed``."""
        state = context.state
        options = context._options
        channel = context._channel
        # the run counts as completed only once its consumer has taken every event
        await channel.wait_consumer_idle()
        if self.conversation_store is not None and options.conversation is None:
            await self.conversation_store.append(context.session_id, state.added)
        for extension in self._extensions:
            await extension.on_success(context, message)
        state.phase = AgentPhase.COMPLETED
        channel.put_nowait(
            AgentEvent(
                AgentEventType.RUN_COMPLETED,
                context.run_id,
                context.session_id,
                message=message,
                usage=state.usage,
                messages=state.added,
                structured=structured,
            )
        )

    async def _notify_cancelled(self, context: AgentRunContext, reason: str) -> None:
        notice = RunCancelledEvent(reason)
        await self._tell_each(
            context, "while handling cancellation", lambda e: e.on_event(context, notice)
        )

    async def _notify_error(self, context: AgentRunContext, error: Exception) -> None:
        await self._tell_each(context, "in on_error", lambda e: e.on_error(context, error))

    async def _tell_each(
        self,
        context: AgentRunContext,
        doing: str,
        call: Callable[[AgentExtension], Awaitable[None]],
    ) -> None:
        """Call every extension; one that fails is logged and the next is still told (the
        run is ending either way)."""
        for extension in self._extensions:
            try:
                await call(extension)
            except Exception:
                logger.exception(
                    "extension %s failed %s",
                    extension.name,
                    doing,
                    extra={"run_id": context.run_id},
                )


def _max_iterations(context: AgentRunContext) -> MaxIterationsError:
    limit = context._options.max_iterations
    return MaxIterationsError(
        f"the model was still calling tools after {limit} model "
        "calls; raise max_iterations or check the tools' results",
        run_id=context.run_id,
    )


def _tool_error_limit(context: AgentRunContext) -> ToolErrorLimitError:
    return ToolErrorLimitError(
        f"{context.state.consecutive_tool_errors} consecutive tool calls failed or were "
        "denied; the run was stopped",
        run_id=context.run_id,
    )
