"""Events a run streams to its consumer, and the phases a run moves through.

The event type names are public literals: the HTTP service sends them verbatim as SSE event
names. They never change once shipped.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .messages import AssistantMessage, Message
from .model import Usage

if TYPE_CHECKING:
    from .structured import StructuredOutput

__all__ = ["TERMINAL_EVENT_TYPES", "AgentEvent", "AgentEventType", "AgentPhase", "EventTap"]


class AgentEventType(enum.StrEnum):
    """The kind of an AgentEvent; the value is the wire name."""

    RUN_STARTED = "run.started"
    RUN_RESUMED = "run.resumed"
    TEXT_DELTA = "text.delta"
    REASONING_DELTA = "reasoning.delta"
    TOOL_CALL_STARTED = "tool.call.started"
    TOOL_CALL_COMPLETED = "tool.call.completed"
    CUSTOM = "custom"
    USAGE = "usage"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"


TERMINAL_EVENT_TYPES = frozenset(
    {AgentEventType.RUN_COMPLETED, AgentEventType.RUN_FAILED, AgentEventType.RUN_CANCELLED}
)


class AgentPhase(enum.StrEnum):
    """Where a run is. The last three are terminal."""

    IDLE = "idle"
    STARTING = "starting"
    MODEL = "model"
    TOOLS = "tools"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for COMPLETED, FAILED and CANCELLED."""
        return self in _TERMINAL_PHASES


_TERMINAL_PHASES = frozenset({AgentPhase.COMPLETED, AgentPhase.FAILED, AgentPhase.CANCELLED})


@dataclass(slots=True)
class AgentEvent:
    """One event of a run.

    Only the fields of the event's type are set: ``delta`` for text and reasoning deltas;
    ``tool_call_id``, ``name``, ``arguments``, ``result``, ``error`` and ``is_error`` for tool
    calls (a completed call has ``arguments`` only when a person edited them on approval);
    ``name``
    and ``payload`` for custom events; ``usage`` for usage and terminal events; ``message`` for
    ``run.completed`` (with ``messages``, every message the run added to the conversation, and
    ``structured``, the validated answer of a run asked for structured output);
    ``error_code`` and ``error`` for ``run.failed`` (with ``reason``, a finer class of some
    failures, e.g. ``malformed_response``); ``reason`` for ``run.cancelled``. ``run_id`` and
    ``session_id`` are filled in by the runtime when an
    extension emits an event without them.
    """

    type: AgentEventType
    run_id: str = ""
    session_id: str | None = None
    model_call_id: str | None = None
    delta: str | None = None
    name: str | None = None
    payload: dict[str, Any] | None = None
    tool_call_id: str | None = None
    arguments: dict[str, Any] | None = None
    result: Any = None
    error: str | None = None
    is_error: bool = False
    usage: Usage | None = None
    message: AssistantMessage | None = None
    messages: list[Message] | None = None
    error_code: str | None = None
    reason: str | None = None
    agent: str | None = None
    model: str | None = None
    structured: StructuredOutput | None = None
    ts: float = field(default_factory=time.time)

    @property
    def is_terminal(self) -> bool:
        """True for run.completed, run.failed and run.cancelled."""
        return self.type in TERMINAL_EVENT_TYPES

    def data(self) -> dict[str, Any]:
        """The event's ``data`` object as the SSE contract defines it for its type."""
        t = self.type
        if t is AgentEventType.TEXT_DELTA or t is AgentEventType.REASONING_DELTA:
            return {"delta": self.delta}
        if t is AgentEventType.TOOL_CALL_STARTED:
            return {
                "tool_call_id": self.tool_call_id,
                "name": self.name,
                "arguments": self.arguments,
            }
        if t is AgentEventType.TOOL_CALL_COMPLETED:
            data: dict[str, Any] = {
                "tool_call_id": self.tool_call_id,
                "name": self.name,
                "is_error": self.is_error,
            }
            if self.is_error:
                data["error"] = self.error
            else:
                data["result"] = self.result
            if self.arguments is not None:
                # a person edited the call's arguments when approving it: what it ran with
                data["arguments"] = self.arguments
                data["edited"] = True
            return data
        if t is AgentEventType.CUSTOM:
            return {"name": self.name, "payload": self.payload or {}}
        if t is AgentEventType.USAGE:
            usage = self.usage or Usage()
            return {"model_call_id": self.model_call_id, **usage.to_dict()}
        if t is AgentEventType.RUN_STARTED:
            return {"agent": self.agent, "model": self.model}
        if t is AgentEventType.RUN_RESUMED:
            return {"agent": self.agent, "model": self.model, **(self.payload or {})}
        if t is AgentEventType.RUN_COMPLETED:
            content = self.message.content if self.message is not None else None
            output: dict[str, Any] = {"content": content or ""}
            if self.structured is not None:
                output["structured"] = self.structured.json
            return {"output": output, "usage": (self.usage or Usage()).to_dict()}
        if t is AgentEventType.RUN_FAILED:
            error = {"code": self.error_code or "internal", "message": self.error or ""}
            if self.reason is not None:
                error["reason"] = self.reason
            return {"error": error}
        return {"reason": self.reason}


EventTap = Callable[[AgentEvent], bool]
"""A consumer's synchronous taker of events, in the run's task (``AgentCore.stream``'s
``tap``): True when it took the event."""
