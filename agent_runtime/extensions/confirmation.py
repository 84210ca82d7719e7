"""Human approval of tool calls whose policy is ``ask``.

Before such a call runs, ``ConfirmationExtension`` emits a ``custom`` event named
``confirmation_requested`` and pauses the run until a ``confirmation_response`` answers it
through ``AgentCore.emit_external_event``, or until it expires. It then records the decision
with ``context.set_tool_decision``; the runtime runs the call it already holds or returns the
denial to the model. An answer cannot change the tool; it can change the arguments only of a
tool declared editable (``agent_runtime.extensions.edits``).

See ``docs/confirmations.md`` for the payloads and the flow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import AnswerRefusedError, ConfigurationError
from ..events import AgentEvent, AgentEventType
from ..messages import ToolCall
from ..tools.base import ToolPolicy
from .edits import EDITED_ARGUMENTS, edited_arguments
from .external import ExternalEvent, ExternalEventExpiredError, ExternalEventExtension
from .replies import reply_of

if TYPE_CHECKING:
    from ..agent import AgentRunContext

__all__ = [
    "CONFIRMATION_REQUESTED",
    "CONFIRMATION_RESOLVED",
    "CONFIRMATION_RESPONSE",
    "ConfirmationExtension",
    "format_expiry",
]

CONFIRMATION_REQUESTED = "confirmation_requested"
"""Name of the ``custom`` event that asks for a decision."""

CONFIRMATION_RESPONSE = "confirmation_response"
"""Name of the external event that carries the decision."""

CONFIRMATION_RESOLVED = "confirmation_resolved"
"""Name of the ``custom`` event that reports the outcome: approved, denied or expired."""


def format_expiry(moment: datetime) -> str:
    """An aware datetime as ISO 8601 in UTC with milliseconds and a ``Z`` suffix."""
    if moment.tzinfo is None:
        raise ValueError("format_expiry needs an aware datetime (one with a time zone)")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _default_question(call: ToolCall) -> str:
    shown = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True, default=str)
    return f"Allow the tool {call.name!r} to run with the arguments {shown}?"


class ConfirmationExtension(ExternalEventExtension):
    """Ask a person before each ``ask``-policy tool call runs.

    Args:
        timeout: seconds a request stays open. Past it the call counts as denied and a late
            answer is refused (``emit_external_event`` returns ``[]``).
        question: builds the question shown to the person from the call; the default names the
            tool and its arguments.

    The request's payload holds ``tool_call_id``, ``tool``, ``arguments``, ``question``,
    ``response_event`` (``"confirmation_response"``) and ``expires_at`` (ISO 8601, UTC), and
    ``editable: true`` for a tool whose arguments may be edited. An answer's payload is
    ``{"tool_call_id": str, "approved": bool}``, with ``"arguments": {...}`` to approve the
    call with edited arguments, or ``"response": "..."`` to deny it with a reply the model
    gets in the tool's place; other keys are ignored and a non-boolean ``approved`` is
    refused without using up the request. An edit the tool does not allow, arguments its
    validation refuses, or a reply that is not text with a denial, raise an
    ``AnswerRefusedError`` from ``emit_external_event`` and use up nothing either.

    Once decided, a ``custom`` event ``confirmation_resolved`` reports ``tool_call_id`` and
    ``outcome`` (``approved``, ``denied`` or ``expired``), so a front end can close its dialog
    and say what happened without parsing the tool's error text; an approval that edited the
    arguments adds ``edited: true`` and the ``arguments`` the call runs with; a denial with a
    reply adds the ``response``.

    Several ``ask`` calls in one model turn are confirmed one after another, in call order:
    the second request is emitted only once the first is decided.
    """

    def __init__(
        self, *, timeout: float = 300.0, question: Callable[[ToolCall], str] | None = None
    ) -> None:
        super().__init__(
            response_event_name=CONFIRMATION_RESPONSE, correlation_field="tool_call_id"
        )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ConfigurationError(f"timeout must be a number of seconds, got {timeout!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigurationError(f"timeout must be a positive, finite number, got {timeout}")
        self.timeout = float(timeout)
        self._question = question if question is not None else _default_question

    def _is_valid_answer(self, event: ExternalEvent) -> bool:
        return isinstance(event.payload.get("approved"), bool)

    def _check_answer(
        self, context: AgentRunContext, subject: object, event: ExternalEvent
    ) -> None:
        if isinstance(subject, ToolCall) and event.payload.get(EDITED_ARGUMENTS) is not None:
            edited_arguments(context.tools.get(subject.name), subject, event.payload)
        if isinstance(subject, ToolCall):
            reply_of(subject.name, event.payload)

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        """Hold an ``ask`` call until it is approved, denied or expired."""
        await super().before_tool(context, call)
        if context.tool_policy(call.name) is not ToolPolicy.ASK:
            return
        if context.has_tool_decision(call.id):
            return  # decided before the run was resumed: not asked again
        if not call.id:
            context.set_tool_decision(
                call.id, False, f"the call to {call.name!r} has no id, so it cannot be confirmed"
            )
            return
        expires = ""
        timeout = self.timeout
        # asked again after a resume: the request keeps the expiry it was first made with
        first = context.resumed_ask_expiry(call.id)
        if first is not None:
            expires = format_expiry(first)
            timeout = (first - datetime.now(UTC)).total_seconds()
            if timeout <= 0:  # it expired while the run was parked or being handed over
                await self._expired(context, call, expires)
                return
        found = context.tools.get(call.name)
        try:
            async with self._wait_for_external_event(
                context, call.id, timeout=timeout, subject=call
            ) as wait:
                if first is None and wait.expires_at is not None:  # always set: a timeout
                    expires = format_expiry(wait.expires_at)
                    await context.record_ask(call, wait.expires_at)
                await context.emit(
                    AgentEvent(
                        AgentEventType.CUSTOM,
                        name=CONFIRMATION_REQUESTED,
                        payload={
                            "tool_call_id": call.id,
                            "tool": call.name,
                            "arguments": dict(call.arguments),
                            "question": self._question(call),
                            "response_event": CONFIRMATION_RESPONSE,
                            "expires_at": expires,
                            **({"editable": True} if found is not None and found.editable else {}),
                            # asked before the run moved here: the same request again
                            **({"resumed": True} if context.is_resumed_ask(call.id) else {}),
                        },
                    )
                )
        except ExternalEventExpiredError:
            await self._expired(context, call, expires)
            return
        answer = self._take_external_event(context, call.id)
        if answer.payload["approved"] is True:
            try:  # checked when the answer was accepted: the same check, the same verdict
                edited = edited_arguments(found, call, answer.payload)
            except AnswerRefusedError as exc:
                context.set_tool_decision(call.id, False, str(exc))
                await self._resolved(context, call, "denied")
                return
            context.set_tool_decision(call.id, True, arguments=edited)
            await self._resolved(context, call, "approved", edited)
        else:
            try:  # checked when the answer was accepted: the same check, the same verdict
                reply = reply_of(call.name, answer.payload)
            except AnswerRefusedError:
                reply = None
            if reply is None:
                context.set_tool_decision(
                    call.id, False, f"the call to {call.name!r} was denied by the user"
                )
            else:
                context.set_tool_decision(
                    call.id,
                    False,
                    f"the call to {call.name!r} was not run: the user answered instead: {reply}",
                )
            await self._resolved(context, call, "denied", reply=reply)

    async def _expired(self, context: AgentRunContext, call: ToolCall, expires: str) -> None:
        context.set_tool_decision(
            call.id,
            False,
            f"the call to {call.name!r} was denied: its confirmation expired at {expires} "
            "without an answer",
        )
        await self._resolved(context, call, "expired")

    @staticmethod
    async def _resolved(
        context: AgentRunContext,
        call: ToolCall,
        outcome: str,
        edited: dict[str, Any] | None = None,
        *,
        reply: str | None = None,
    ) -> None:
        payload: dict[str, Any] = {"tool_call_id": call.id, "outcome": outcome}
        if edited is not None:
            payload.update(edited=True, arguments=dict(edited))
        if reply is not None:
            payload["response"] = reply
        await context.emit(
            AgentEvent(AgentEventType.CUSTOM, name=CONFIRMATION_RESOLVED, payload=payload)
        )
