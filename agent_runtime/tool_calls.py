"""The tool calls of one model response: announced, checked (hooks, policy, approval),
run (sequentially or overlapping), each result checkpointed before it is told.

``ToolCalls`` is held by ``AgentCore`` (``agent_runtime.agent``), one per agent; a resumed
run's open calls go on here from the state their checkpoint saved them in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .checkpoints import RunCheckpoint, unknown_outcome
from .errors import AnswerRefusedError
from .events import AgentEvent, AgentEventType
from .extensions.base import AgentExtension, ToolOutcome
from .extensions.edits import edited_arguments
from .messages import ToolCall, ToolMessage
from .run_context import AgentRunContext
from .tools.base import Tool, ToolPolicy
from .tools.execution import ToolExecutor
from .tools.results import MediaResult, media_result

if TYPE_CHECKING:
    from .tracing import RunTracer

__all__ = ["ToolCalls"]

logger = logging.getLogger("agent_runtime")


class ToolCalls:
    """The tool calls of an agent's runs: its extensions' hooks, its executor, its tracer."""

    __slots__ = ("_executor", "_extensions", "_tracer")

    def __init__(
        self, extensions: Sequence[AgentExtension], executor: ToolExecutor, tracer: RunTracer
    ) -> None:
        # the agent's own list: an extension added later takes part in later calls
        self._extensions = extensions
        self._executor = executor
        self._tracer = tracer

    async def resume(
        self, context: AgentRunContext, checkpoint: RunCheckpoint
    ) -> list[ToolMessage]:
        """The open calls of a resumed run: each goes on from the state it was saved in."""
        calls: list[ToolCall] = []
        settled: dict[str, str] = {}  # a started call of a tool that must not run twice
        asks: dict[str, datetime | None] = {}
        tools = context._options.tools
        expiries = {c.call_id: c.expires_at for c in checkpoint.calls}
        for call, call_state in checkpoint.open_calls():
            calls.append(call)
            found = tools.get(call.name)
            if call_state == "started":
                if found is not None and found.idempotent:
                    context.set_tool_decision(call.id, True)  # it was allowed to start
                else:
                    settled[call.id] = unknown_outcome(call)
            elif call_state == "approved":
                context.set_tool_decision(call.id, True)
                context.state.approvals[call.id] = "approved"
            elif call_state == "denied":
                context.set_tool_decision(
                    call.id, False, f"the call to {call.name!r} was denied by the user"
                )
                context.state.approvals[call.id] = "denied"
            elif call_state == "awaiting_approval":
                asks[call.id] = expiries.get(call.id)
        context._resumed_asks = asks
        checkpoints = context._checkpoints
        if checkpoints is not None:
            checkpoints.open(calls)
            for call, call_state in checkpoint.open_calls():
                checkpoints.mark(call, call_state, expiries.get(call.id))
        return await self.run(context, calls, settled=settled, announced=True)

    async def run(
        self,
        context: AgentRunContext,
        calls: list[ToolCall],
        *,
        settled: Mapping[str, str] | None = None,
        announced: bool = False,
    ) -> list[ToolMessage]:
        """Run one model response's calls. ``settled``: calls whose result is this error, not
        run (a resumed run's unknown outcomes); ``announced``: a resumed run's calls, whose
        ``tool.call.started`` its consumer already saw unless they were still pending."""
        options = context._options
        if settled or announced:
            pending = {
                c.call_id
                for c in (options.resume.calls if options.resume is not None else ())
                if c.state == "pending"
            }
            results = []
            for call in calls:
                refusal = (settled or {}).get(call.id)
                if refusal is not None:
                    ready: Tool | str = refusal
                else:
                    ready = await self._prepare_call(
                        context, call, announce=not announced or call.id in pending
                    )
                results.append(await self._finish_call(context, call, ready))
            self._count_errors(context, results)
            return results
        if options.parallel_tool_calls and len(calls) > 1:
            results = await self._run_overlapping(context, calls)
        else:
            results = []
            for call in calls:
                ready = await self._prepare_call(context, call)
                results.append(await self._finish_call(context, call, ready))
        self._count_errors(context, results)
        return results

    async def _run_overlapping(
        self, context: AgentRunContext, calls: Sequence[ToolCall]
    ) -> list[ToolMessage]:
        """Several calls at once: their checks (hooks, permissions) stay sequential in call
        order, their execution overlaps. (A method of its own: its comprehensions' closures
        would hold cells in ``run``'s frame for as long as any call waits for an answer.)"""
        prepared = [await self._prepare_call(context, call) for call in calls]
        finished = await asyncio.gather(
            *(
                self._finish_call(context, call, ready)
                for call, ready in zip(calls, prepared, strict=True)
            )
        )
        return list(finished)

    @staticmethod
    def _count_errors(context: AgentRunContext, results: Sequence[ToolMessage]) -> None:
        state = context.state
        for result in results:
            if result.is_error:
                state.consecutive_tool_errors += 1
            else:
                state.consecutive_tool_errors = 0

    async def _prepare_call(
        self, context: AgentRunContext, call: ToolCall, *, announce: bool = True
    ) -> Tool | str:
        """Announce a call, run before_tool hooks and checks; a string is the refusal."""
        if announce:
            await context._channel.put(
                AgentEvent(
                    AgentEventType.TOOL_CALL_STARTED,
                    context.run_id,
                    context.session_id,
                    tool_call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
        found = context._options.tools.get(call.name)
        if found is None:
            return f"unknown tool {call.name!r}: it is not available in this run"
        skills = context._options.skill_state
        if skills is not None and not skills.allows(call.name):
            # refused before any hook or approval: an unadvertised tool never asks anyone
            return skills.refusal(call.name)
        checkpoints = context._checkpoints
        asks = (
            checkpoints is not None
            and not context.has_tool_decision(call.id)
            and context.tool_policy(call.name) is ToolPolicy.ASK
        )
        if asks and checkpoints is not None:
            # saved before the wait: a run parked or lost while it waits is resumed waiting
            checkpoints.mark(call, "awaiting_approval")
            await self._save_checkpoint(context)
        for extension in self._extensions:
            await extension.before_tool(context, call)
        policy = context.tool_policy(call.name)
        if policy is ToolPolicy.DENY:
            return f"tool {call.name!r} is not allowed by policy"
        if policy is ToolPolicy.ASK:
            approved, reason = await self._ask(context, call)
            edit = context.take_tool_edit(call.id)
            if approved and edit is not None:
                try:  # an approver's edit is checked here too: the run holds the last word
                    checked = edited_arguments(found, call, {"approved": True, "arguments": edit})
                except AnswerRefusedError as exc:
                    approved, reason = False, f"the call to {call.name!r} was denied: {exc}"
                else:
                    if checked is not None:
                        # before the checkpoint below: a resumed run runs what was approved
                        call = context.state.edit_call(call, checked)
            context.state.approvals[call.id] = "approved" if approved else "denied"
            if asks and checkpoints is not None:
                checkpoints.mark(call, "approved" if approved else "denied")
                await self._save_checkpoint(context)
            if not approved:
                return reason or f"the call to {call.name!r} was denied"
        return found

    async def _save_checkpoint(self, context: AgentRunContext) -> None:
        checkpoints = context._checkpoints
        if checkpoints is not None:
            state = context.state
            await checkpoints.save(state.added, state.iteration, state.usage)

    async def _ask(self, context: AgentRunContext, call: ToolCall) -> tuple[bool, str | None]:
        decision = context.take_tool_decision(call.id)
        if decision is not None:
            return decision
        callback = context._options.permission_callback
        if callback is None:
            return False, (
                f"the call to {call.name!r} was denied: it needs approval and no approver "
                "is configured"
            )
        try:
            verdict = callback(context, call)
            if asyncio.iscoroutine(verdict) or isinstance(verdict, Awaitable):
                verdict = await verdict
        except Exception as exc:  # a failing approver fails closed
            logger.warning(
                "permission callback raised; the call is denied",
                extra={"run_id": context.run_id, "tool": call.name, "error": type(exc).__name__},
            )
            return False, f"the call to {call.name!r} was denied (approval check failed)"
        if verdict is True:
            return True, None
        return False, f"the call to {call.name!r} was denied"

    async def _finish_call(
        self, context: AgentRunContext, call: ToolCall, ready: Tool | str
    ) -> ToolMessage:
        edited = context.state.edits.get(call.id)
        if edited is not None:  # approved with a person's arguments: it runs with those
            call = ToolCall(call.id, call.name, edited)
        checkpoints = context._checkpoints
        if checkpoints is not None and not isinstance(ready, str) and not ready.idempotent:
            # saved before the body starts: a resumed run does not run it a second time
            checkpoints.mark(call, "started")
            await self._save_checkpoint(context)
        gate = context._options.tool_gate
        if gate is not None and not isinstance(ready, str):
            # asked here, with nothing awaited before the call starts: what it says holds
            ready = gate(call) or ready
        with self._tracer.tool_call(context, call) as trace:
            if isinstance(ready, str):
                outcome_error: str | None = ready
                result: Any = None
            else:
                timeout = (
                    ready.timeout if ready.timeout is not None else context._options.tool_timeout
                )
                result, outcome_error = await self._executor.execute(ready, call, timeout, context)
            media, outcome_error = await _stored_media(context, result, outcome_error)
            if media is not None:
                result = media.described
            outcome = ToolOutcome(result, outcome_error)
            trace.outcome(outcome, refused=isinstance(ready, str))
            for extension in self._extensions:
                await extension.after_tool(context, call, outcome)
        is_error = outcome_error is not None
        if is_error:
            content = f"Error: {outcome_error}"
        else:
            content = media.text if media is not None else self._executor.render(result)
        approval = context.state.approvals.get(call.id)
        message = ToolMessage(
            call.id,
            call.name,
            content,
            is_error,
            approval=approval,
            parts=media.parts if media is not None else [],
        )
        if checkpoints is not None:
            # saved before it is told: a reader never sees a result a resume would not know
            checkpoints.finished(message)
            await self._save_checkpoint(context)
        await context._channel.put(
            AgentEvent(
                AgentEventType.TOOL_CALL_COMPLETED,
                context.run_id,
                context.session_id,
                tool_call_id=call.id,
                name=call.name,
                arguments=edited,  # only an edited call's: they differ from the announced ones
                result=None if is_error else result,
                error=outcome_error,
                is_error=is_error,
            )
        )
        return message


async def _stored_media(
    context: AgentRunContext, result: Any, error: str | None
) -> tuple[MediaResult | None, str | None]:
    """The images and documents of a result, stored before anything holds the result (from
    here on it carries their references, never their bytes); an error if they cannot be."""
    if error is not None:
        return None, error
    try:
        return await media_result(result, context.agent.content_store, context.session_id), None
    except Exception as exc:  # the content store failed: the model is told, the run goes on
        logger.warning(
            "a tool result's media could not be stored",
            extra={"run_id": context.run_id, "error": type(exc).__name__},
        )
        return None, f"the tool's result could not be stored ({type(exc).__name__}: {exc})"
