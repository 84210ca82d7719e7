"""Run checkpoints: what a run has done so far, so that another process can go on with it.

With a ``checkpoint_sink`` (a run option, or the agent's default), a run hands the sink a
``RunCheckpoint`` after each model response, when an ``ask`` call starts waiting for its
approval and when it is decided, just before the body of a tool that is not idempotent
starts, and after each tool result. ``AgentCore.resume(checkpoint)`` continues the run from
one: a model call is simply made again (it has no effect outside), but a tool call that had
started and whose result was not saved is not run again unless its tool is idempotent
(``@tool(idempotent=True)``): its result tells the model that the outcome is unknown. Saves of
one run never overlap, and each carries a higher ``step`` than the one before.

Without a sink nothing of this happens: no snapshot is built, nothing is awaited.

A checkpoint holds images and documents by reference (the run stored their bytes in its
agent's ``ContentStore`` when it started), and an answer's ``reasoning_state``, which only its
provider reads: a checkpoint is the run's own record, never shown to a client.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from agent_runtime.errors import CheckpointError
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolMessage,
    message_from_dict,
    message_to_dict,
)
from agent_runtime.model import Usage

__all__ = [
    "CHECKPOINT_VERSION",
    "CallState",
    "CheckpointSink",
    "CheckpointedCall",
    "RunCheckpoint",
    "unknown_outcome",
]

CHECKPOINT_VERSION = 1

CallState = Literal["pending", "awaiting_approval", "approved", "denied", "started"]
"""Where a tool call of the run's last model response is: not looked at yet, waiting for a
person's answer, approved or denied (not started yet), or started (its body may have run)."""

_CALL_STATES = frozenset(get_args(CallState))


@dataclass(frozen=True, slots=True)
class CheckpointedCall:
    """A tool call of the last model response that has no result yet, and its state."""

    call_id: str
    name: str
    state: CallState
    expires_at: datetime | None = None
    """When a call ``awaiting_approval`` stops waiting (its confirmation's expiry), if known:
    the same request, asked again after a resume, expires then too."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        data: dict[str, Any] = {"call_id": self.call_id, "name": self.name, "state": self.state}
        if self.expires_at is not None:
            data["expires_at"] = self.expires_at.astimezone(UTC).isoformat()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointedCall:
        """Read ``to_dict``'s form."""
        expires = data.get("expires_at")
        moment = None if expires is None else datetime.fromisoformat(_text(expires))
        if moment is not None and moment.tzinfo is None:
            raise CheckpointError("a call's expires_at needs a time zone")
        return cls(str(data["call_id"]), str(data["name"]), _state(data["state"]), moment)


@dataclass(frozen=True, slots=True)
class RunCheckpoint:
    """A run's progress: what it added to the conversation so far, and its open calls.

    ``added`` is the run's part of the conversation, its user prompt first (the results of
    the calls already finished included); ``calls`` are the calls of the last assistant
    message in ``added`` that have no result in it yet.
    """

    run_id: str
    session_id: str
    step: int
    prompt: str
    added: tuple[Message, ...]
    iteration: int
    usage: Usage
    calls: tuple[CheckpointedCall, ...] = ()
    skill: str | None = None
    structured_answers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (``RunCheckpoint.from_dict`` reads it back)."""
        return {
            "version": CHECKPOINT_VERSION,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "step": self.step,
            "prompt": self.prompt,
            # private: a signed reasoning state must go back to its provider when the run goes
            # on (a checkpoint stays with the service, never reaches a client)
            "added": [message_to_dict(message, private=True) for message in self.added],
            "iteration": self.iteration,
            "usage": self.usage.to_dict(),
            "calls": [c.to_dict() for c in self.calls],
            "skill": self.skill,
            "structured_answers": self.structured_answers,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunCheckpoint:
        """Read ``to_dict``'s form; ``CheckpointError`` for a bad shape or another version."""
        if not isinstance(data, Mapping):
            raise CheckpointError("a checkpoint is a JSON object")
        version = data.get("version")
        if version != CHECKPOINT_VERSION:
            raise CheckpointError(
                f"checkpoint version {version!r} is not {CHECKPOINT_VERSION}, the one this "
                "runtime reads"
            )
        try:
            usage = data.get("usage") or {}
            calls = tuple(CheckpointedCall.from_dict(c) for c in data.get("calls") or ())
            skill = data.get("skill")
            checkpoint = cls(
                run_id=_text(data["run_id"]),
                session_id=_text(data["session_id"]),
                step=_count(data["step"]),
                prompt=_text(data["prompt"]),
                added=tuple(message_from_dict(dict(m)) for m in data["added"]),
                iteration=_count(data["iteration"]),
                usage=_usage(usage),
                calls=calls,
                skill=None if skill is None else _text(skill),
                structured_answers=_count(data.get("structured_answers", 0)),
            )
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"not a run checkpoint: {type(exc).__name__}: {exc}") from None
        checkpoint.open_calls()  # the calls must be those of the last model response
        return checkpoint

    def open_calls(self) -> list[tuple[ToolCall, CallState]]:
        """The open calls with their full arguments, in the model's order."""
        if not self.calls:
            return []
        states = {c.call_id: c.state for c in self.calls}
        last = next(
            (m for m in reversed(self.added) if isinstance(m, AssistantMessage)),
            None,
        )
        if last is None:
            raise CheckpointError("a checkpoint with open calls has no model response")
        found = [(call, states[call.id]) for call in last.tool_calls if call.id in states]
        if len(found) != len(states):
            raise CheckpointError("a checkpoint's open calls are not its last response's")
        return found


@runtime_checkable
class CheckpointSink(Protocol):
    """Where a run's checkpoints go (a store, a queue...). An exception from ``save`` ends
    the run as failed with that error: a run must not go on past a progress it could not
    record (a service's sink raises once its worker no longer holds the run)."""

    async def save(self, checkpoint: RunCheckpoint) -> None:
        """Keep ``checkpoint`` (it replaces the run's earlier ones)."""
        ...


def unknown_outcome(call: ToolCall) -> str:
    """The error a started, non-idempotent call gets when its run is resumed."""
    return (
        f"the outcome of this call to {call.name!r} is unknown: the process running it stopped "
        "before its result was recorded, so it was not run again. Do not assume that it ran, "
        "or that it did not; check its effect before calling it again"
    )


@dataclass(eq=False, slots=True)
class Checkpointer:
    """One run's side of the checkpoints: the open calls' states, the results so far, and
    saves in order (one at a time, each from the state as it is when it is taken).

    ``calls`` and ``results`` are tuples, replaced on each change: a batch holds a call or a
    few, and a run waiting for an answer keeps them for as long as it waits (an empty tuple
    is shared, a dict of one entry is ~180 bytes)."""

    sink: CheckpointSink
    run_id: str
    session_id: str
    prompt: str
    step: int = 0
    calls: tuple[CheckpointedCall, ...] = ()
    results: tuple[ToolMessage, ...] = ()
    structured_answers: int = 0
    skill: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def open(self, calls: Sequence[ToolCall]) -> None:
        """A model response with ``calls``: each is pending."""
        self.results = ()
        self.calls = tuple(CheckpointedCall(c.id, c.name, "pending") for c in calls)

    def holds(self, call_id: str) -> bool:
        """Whether the call is one of the open calls."""
        return any(c.call_id == call_id for c in self.calls)

    def mark(self, call: ToolCall, state: CallState, expires_at: datetime | None = None) -> None:
        """Move one open call to ``state`` (``expires_at``: when its wait for an answer ends)."""
        marked = CheckpointedCall(call.id, call.name, state, expires_at)
        if self.holds(call.id):
            self.calls = tuple(marked if c.call_id == call.id else c for c in self.calls)
        else:
            self.calls = (*self.calls, marked)

    def finished(self, result: ToolMessage) -> None:
        """A call's result: it leaves the open calls."""
        self.calls = tuple(c for c in self.calls if c.call_id != result.tool_call_id)
        self.results = (
            *(r for r in self.results if r.tool_call_id != result.tool_call_id),
            result,
        )

    def close(self) -> None:
        """The batch's results are in the conversation now."""
        self.calls = ()
        self.results = ()

    async def save(self, added: Sequence[Message], iteration: int, usage: Usage) -> None:
        """Hand the sink a checkpoint of now (``added`` without this batch's results)."""
        async with self._lock:
            self.step += 1
            checkpoint = RunCheckpoint(
                run_id=self.run_id,
                session_id=self.session_id,
                step=self.step,
                prompt=self.prompt,
                added=(*added, *self.results),
                iteration=iteration,
                usage=dataclasses.replace(usage),
                calls=self.calls,
                skill=self.skill,
                structured_answers=self.structured_answers,
            )
            await self.sink.save(checkpoint)


def _usage(data: Mapping[str, Any]) -> Usage:
    """``Usage.to_dict``'s form read back (the details only where they were written)."""

    def detail(name: str) -> int | None:
        value = data.get(name)
        return None if value is None else int(value)

    return Usage(
        int(data.get("input_tokens", 0)),
        int(data.get("output_tokens", 0)),
        data.get("model"),
        cached_input_tokens=detail("cached_input_tokens"),
        cache_write_tokens=detail("cache_write_tokens"),
        reasoning_tokens=detail("reasoning_tokens"),
    )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise CheckpointError(f"expected text, got {type(value).__name__}")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"expected a count, got {value!r}")
    return value


def _state(value: Any) -> CallState:
    if value not in _CALL_STATES:
        raise CheckpointError(f"unknown call state {value!r}")
    state: CallState = value
    return state
