"""A run's wire events as one A2A task: its stream events and the ``Task`` object.

A task is a run (``task.id`` = run id) and its context is the run's session. ``TaskBuilder``
reads the run's wire events in order, from the start or from a cursor, and keeps the task's
state; streaming, each event also yields the A2A events it means:

- ``run.started`` → status ``TASK_STATE_WORKING``;
- ``text.delta`` → an artifact update (one artifact per stretch of text, appended chunk by
  chunk);
- ``tool.call.started`` / ``tool.call.completed`` → status ``WORKING`` with a data part naming
  the call or its result;
- ``custom`` ``confirmation_requested`` → status ``TASK_STATE_INPUT_REQUIRED``, with the question
  and a data part describing the held call; the answer is a message on the same task with a
  data part ``{"approved": true|false}``;
- ``run.completed`` / ``run.failed`` / ``run.cancelled`` → ``COMPLETED`` / ``FAILED`` /
  ``CANCELED``, with the answer or the error as the status message;
- ``reasoning.delta`` → nothing: A2A has no part for a model's reasoning, and a calling agent
  would read any text or data part we put it in as the answer (docs/protocols.md).

A stream stops at the first of those it shows after its start: the end of the run, or a
question (``done``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from a2a.server.events import Event
from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format, timestamp_pb2

__all__ = [
    "STATE_OF_STATUS",
    "TaskBuilder",
    "agent_message",
    "data_of",
    "data_part",
    "user_message",
]

_WAITING_EVENT = "confirmation_requested"

STATE_OF_STATUS: Mapping[str, pb.TaskState] = {
    "queued": pb.TASK_STATE_SUBMITTED,
    "running": pb.TASK_STATE_WORKING,
    "waiting": pb.TASK_STATE_INPUT_REQUIRED,
    "completed": pb.TASK_STATE_COMPLETED,
    "failed": pb.TASK_STATE_FAILED,
    "cancelled": pb.TASK_STATE_CANCELED,
}
_TERMINAL_STATES = frozenset(
    {pb.TASK_STATE_COMPLETED, pb.TASK_STATE_FAILED, pb.TASK_STATE_CANCELED}
)


def data_part(value: Mapping[str, Any]) -> pb.Part:
    """A data part holding ``value``."""
    part = pb.Part()
    json_format.ParseDict(dict(value), part.data)
    return part


def data_of(message: pb.Message) -> list[dict[str, Any]]:
    """The objects of a message's data parts."""
    found: list[dict[str, Any]] = []
    for part in message.parts:
        if part.HasField("data"):
            value = json_format.MessageToDict(part.data)
            if isinstance(value, dict):
                found.append(value)
    return found


def _timestamp(ts: Any = None) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    moment: datetime | None = None
    if isinstance(ts, datetime):
        moment = ts
    elif isinstance(ts, str):
        try:
            moment = datetime.fromisoformat(ts)
        except ValueError:
            moment = None
    stamp.FromDatetime(moment or datetime.now(UTC))
    return stamp


def user_message(
    run_id: str, session_id: str, text: str, parts: Sequence[pb.Part] = ()
) -> pb.Message:
    """The run's input as the task's first message: its parts (files by reference), or its
    text."""
    return pb.Message(
        message_id=f"{run_id}-input",
        context_id=session_id,
        task_id=run_id,
        role=pb.ROLE_USER,
        parts=list(parts) or [pb.Part(text=text)],
    )


def agent_message(
    run_id: str, session_id: str, message_id: str, text: str, data: Mapping[str, Any] | None = None
) -> pb.Message:
    """A message of the agent on the task: text, and optionally a data part."""
    parts = [pb.Part(text=text)] if text else []
    if data is not None:
        parts.append(data_part(data))
    return pb.Message(
        message_id=message_id,
        context_id=session_id,
        task_id=run_id,
        role=pb.ROLE_AGENT,
        parts=parts,
    )


class TaskBuilder:
    """One task read from its run's log; ``feed`` returns the A2A events each wire event means."""

    def __init__(
        self,
        *,
        run_id: str,
        session_id: str,
        input_text: str,
        input_parts: Sequence[pb.Part] = (),
        state: pb.TaskState = pb.TASK_STATE_SUBMITTED,
        created_at: datetime | None = None,
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.done = False
        self.pending_call: str | None = None  # the held tool call, while input is required
        self.pending_seq = 0  # the seq of its question
        self.last_seq = 0  # the seq of the last wire event read
        self._input = user_message(run_id, session_id, input_text, input_parts)
        self._state = state
        self._status_message: pb.Message | None = None
        self._timestamp = _timestamp(created_at)
        self._artifacts: list[pb.Artifact] = []
        self._artifact_open = False
        self._answer: pb.Message | None = None

    @property
    def state(self) -> pb.TaskState:
        return self._state

    @property
    def terminal(self) -> bool:
        return self._state in _TERMINAL_STATES

    def task(self, history_length: int | None = None) -> pb.Task:
        """The task as it stands."""
        status = pb.TaskStatus(state=self._state, timestamp=self._timestamp)
        if self._status_message is not None:
            status.message.CopyFrom(self._status_message)
        history = [self._input]
        if self._answer is not None:
            history.append(self._answer)
        if history_length is not None:
            history = history[-history_length:] if history_length > 0 else []
        return pb.Task(
            id=self.run_id,
            context_id=self.session_id,
            status=status,
            artifacts=self._artifacts,
            history=history,
        )

    def _status(self, state: pb.TaskState, message: pb.Message | None, ts: Any) -> Event:
        self._state = state
        self._status_message = message
        self._timestamp = _timestamp(ts)
        status = pb.TaskStatus(state=state, timestamp=self._timestamp)
        if message is not None:
            status.message.CopyFrom(message)
        return pb.TaskStatusUpdateEvent(
            task_id=self.run_id, context_id=self.session_id, status=status
        )

    def _message(self, seq: int, text: str, data: Mapping[str, Any] | None = None) -> pb.Message:
        return agent_message(self.run_id, self.session_id, f"{self.run_id}-{seq}", text, data)

    def feed(self, document: Mapping[str, Any]) -> list[Event]:
        """Take the run's next wire event; the A2A events it means."""
        if self.done:
            return []
        type_ = document["type"]
        seq = int(document.get("seq", 0))
        self.last_seq = max(self.last_seq, seq)
        ts = document.get("ts")
        data: Mapping[str, Any] = document.get("data") or {}
        if type_ == "text.delta":
            return [self._delta(seq, str(data.get("delta") or ""))]
        if type_ == "run.started":
            return [self._status(pb.TASK_STATE_WORKING, None, ts)]
        if type_ == "tool.call.started":
            self._artifact_open = False
            call = {
                "tool_call": {
                    "id": data.get("tool_call_id"),
                    "name": data.get("name"),
                    "arguments": data.get("arguments"),
                }
            }
            text = f"Calling the tool {data.get('name')}."
            return [self._status(pb.TASK_STATE_WORKING, self._message(seq, text, call), ts)]
        if type_ == "tool.call.completed":
            result = {
                "tool_result": {
                    "id": data.get("tool_call_id"),
                    "name": data.get("name"),
                    "is_error": bool(data.get("is_error")),
                    "result": data.get("error") if data.get("is_error") else data.get("result"),
                }
            }
            return [self._status(pb.TASK_STATE_WORKING, self._message(seq, "", result), ts)]
        if type_ == "custom" and data.get("name") == _WAITING_EVENT:
            return [self._question(seq, data.get("payload") or {}, ts)]
        if type_ == "run.completed":
            output = data.get("output") or {}
            text = str(output.get("content") or "") if isinstance(output, dict) else ""
            self._answer = self._message(seq, text)
            self.done = True
            return [self._status(pb.TASK_STATE_COMPLETED, self._answer, ts)]
        if type_ == "run.failed":
            error = data.get("error") or {}
            text = f"{error.get('code') or 'internal'}: {error.get('message') or 'the run failed'}"
            self.done = True
            message = self._message(seq, text, {"error": dict(error)})
            return [self._status(pb.TASK_STATE_FAILED, message, ts)]
        if type_ == "run.cancelled":
            reason = str(data.get("reason") or "cancel_requested")
            self.done = True
            message = self._message(seq, f"The task was cancelled ({reason}).", {"reason": reason})
            return [self._status(pb.TASK_STATE_CANCELED, message, ts)]
        return []

    def _delta(self, seq: int, delta: str) -> Event:
        append = self._artifact_open
        if not append:
            self._artifacts.append(
                pb.Artifact(artifact_id=f"{self.run_id}-text-{seq}", name="answer")
            )
            self._artifact_open = True
        artifact = self._artifacts[-1]
        if artifact.parts:
            artifact.parts[0].text += delta
        else:
            artifact.parts.append(pb.Part(text=delta))
        chunk = pb.Artifact(
            artifact_id=artifact.artifact_id, name=artifact.name, parts=[pb.Part(text=delta)]
        )
        return pb.TaskArtifactUpdateEvent(
            task_id=self.run_id, context_id=self.session_id, artifact=chunk, append=append
        )

    def _question(self, seq: int, payload: Mapping[str, Any], ts: Any) -> Event:
        self._artifact_open = False
        call_id = str(payload.get("tool_call_id") or "")
        self.pending_call = call_id
        self.pending_seq = seq
        self.done = True
        question = str(payload.get("question") or f"Allow the tool {payload.get('tool')!r}?")
        details = {
            "confirmation": {
                "tool_call_id": call_id,
                "tool": payload.get("tool"),
                "arguments": payload.get("arguments"),
                "expires_at": payload.get("expires_at"),
            },
            "answer_with": {"approved": True},
        }
        message = self._message(
            seq,
            f'{question} Answer with a data part {{"approved": true}} '
            'or {"approved": false} on this task.',
            details,
        )
        return self._status(pb.TASK_STATE_INPUT_REQUIRED, message, ts)

    def resume(self) -> None:
        """Read on past the question this builder stopped at (its answer was delivered)."""
        self.done = False
        self.pending_call = None
        self._state = pb.TASK_STATE_WORKING
        self._status_message = None
