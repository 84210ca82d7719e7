"""A run as this worker holds it: the request's options, its state, and how it ended."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal, cast

from agent_runtime.content import ContentPart, TextPart, part_to_dict
from agent_runtime.messages import Message
from agent_runtime.model import Usage
from agent_runtime.run_options import OPTION_NAMES, RunOptions
from app.admission.budgets import BudgetHold
from app.admission.slots import Ticket
from app.agents.build import AgentProfile
from app.bus.base import Lease
from app.bus.wire import WireEncoder, iso_ms
from app.storage import CheckpointRecord, RunRecord, RunStatus
from app.storage.schedules import FiringFence

__all__ = [
    "CANCEL_REASONS",
    "HANDOVER",
    "NO_METADATA",
    "REQUEST_OPTIONS",
    "Outcome",
    "RunHandle",
    "RunRequestOptions",
    "lost_outcome",
    "new_run_id",
    "now",
    "record_view",
    "stored_parts",
]

CANCEL_REASONS = frozenset({"client_disconnected", "cancel_requested", "shutdown", "superseded"})
HANDOVER = "handover"
"""The runtime's cancel reason for a run that goes on on another worker (never on the wire)."""


_NONE_RUNNING: frozenset[str] = frozenset()
NO_METADATA: Mapping[str, Any] = MappingProxyType({})
"""The metadata of a run that has none: one read-only mapping shared by all of them."""


def new_run_id() -> str:
    """A run id: ``run_`` and 128 random bits in hex."""
    return f"run_{secrets.token_hex(16)}"


def now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_ms(moment.timestamp())


@dataclass(frozen=True, slots=True)
class RunRequestOptions:
    """What a run request asks for (validated at the HTTP edge).

    ``input`` is the run's text (its title, its record, its logs); ``parts`` its content
    parts when it was given as parts (``app.files.intake``: media by file id or https URL,
    never bytes), else empty: the run is asked ``parts`` if there are any, else ``input``.
    """

    input: str
    parts: tuple[ContentPart, ...] = ()
    agent: str = "default"
    background: bool = False
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    run_timeout: float | None = None
    max_iterations: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: NO_METADATA)
    # the session's latest run, whose turn this one takes the place of (app.runs.turns)
    replaces: str | None = None
    system_prompt: str | None = None
    """Replaces the agent's system prompt for this run (OpenAI ``instructions``)."""
    skill: str | None = None
    """One of the agent's skills, active from the run's start."""
    response_format: Mapping[str, Any] | None = None
    """The runtime's ``response_format`` (structured output), already validated."""
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] = "reject"
    """What the start does while the session has an active run (``app.runs.multitask``)."""
    webhook_url: str | None = None
    """Where the run's end and confirmation requests are posted (``app.webhooks``); None:
    the agent's own ``webhook_url``, if any."""
    firing: FiringFence | None = None
    """The schedule's firing this run is started for: the run is created only while its
    starter still holds the firing with that token (``app.schedules``)."""
    branch_from: str | None = None
    """The run whose turn this run continues (a fork, ``app.runs.branches``); None: the
    session's latest turn. Checked by whoever sets it to be a turn of the session."""
    stateless: bool = False
    """A stateless protocol call's run: a session it creates is not listed and is deleted
    once idle for ``AGENT_STATELESS_RETENTION`` (``app.runs.stateless``)."""

    @property
    def file_ids(self) -> tuple[str, ...]:
        """The ids of the files the parts refer to (``ref``), each once."""
        return tuple(
            dict.fromkeys(
                part.ref for part in self.parts if not isinstance(part, TextPart) and part.ref
            )
        )

    @property
    def prompt(self) -> str | list[ContentPart]:
        """What the run asks its agent: the parts, or the text when there are none."""
        return list(self.parts) if self.parts else self.input

    def run_options(self) -> RunOptions:
        """The runtime's options this request sets (those not None)."""
        values = {name: getattr(self, name) for name in REQUEST_OPTIONS}
        return cast(
            RunOptions, {name: value for name, value in values.items() if value is not None}
        )


REQUEST_OPTIONS: tuple[str, ...] = tuple(
    item.name for item in fields(RunRequestOptions) if item.name in OPTION_NAMES
)
"""The runtime's options (``RunOptions``) a run request may set: the fields of
``RunRequestOptions`` named as one."""


@dataclass(slots=True)
class Outcome:
    """How a run ended: its terminal event's type and data, and what is stored."""

    status: RunStatus
    event_type: str
    data: dict[str, Any]
    output: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    messages: Sequence[Message] = ()

    @classmethod
    def failed(cls, code: str, message: str) -> Outcome:
        error = {"code": code, "message": message}
        return cls("failed", "run.failed", {"error": error}, error=error)

    @classmethod
    def cancelled(cls, reason: str) -> Outcome:
        return cls("cancelled", "run.cancelled", {"reason": reason})


def lost_outcome() -> Outcome:
    """How a run ends on a worker that lost its session lease (what the sweep writes too)."""
    return Outcome.failed(
        "worker_lost", "this worker lost the run's session lease; the run was ended"
    )


class RunHandle:
    """A run held by this worker, from its request until its terminal event.

    ``lease_deadline`` is when, on this worker's monotonic clock, its lease may have lapsed
    (``app.runs.fencing``); ``fenced`` is set once the run was fenced off at that deadline,
    and ``fenced_off`` resolves then (the run's streams end on it).
    """

    # A worker may hold thousands of runs waiting for an answer, for hours: what a handle keeps
    # is counted per run (docs/benchmarks.md, "Waiting capacity"). Its futures and sets are
    # made when first asked for, and what the store, the checkpoint or the request already
    # hold is not copied here.
    __slots__ = (
        "_ask_waiter",
        "_done",
        "_fenced_off",
        "_finished",
        "_tools_running",
        "appending",
        "asked",
        "asking",
        "budget",
        "cancel_reason",
        "checkpoint_step",
        "created_at",
        "encoder",
        "error",
        "fenced",
        "finalizing",
        "finished_at",
        "history_size",
        "in_runtime",
        "lease",
        "lease_deadline",
        "new_session",
        "opened",
        "options",
        "output",
        "principal",
        "profile",
        "recorded",
        "resumed_from",
        "run_id",
        "seq",
        "session_id",
        "started_at",
        "status",
        "t_accepted",
        "t_first_event",
        "task",
        "task_cancelled",
        "ticket",
        "usage",
        "usage_before",
    )

    def __init__(
        self,
        run_id: str,
        session_id: str,
        principal: str,
        profile: AgentProfile,
        options: RunRequestOptions,
        lease: Lease,
        ticket: Ticket,
        lease_deadline: float = float("inf"),
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.principal = principal
        self.profile = profile
        self.options = options
        self.lease = lease
        self.ticket = ticket
        # the run's reservation of its token budgets (app.admission.budgets), settled at its end
        self.budget: BudgetHold | None = None
        self.status: RunStatus = "queued"
        self.created_at = now()
        self.started_at: datetime | None = None
        self.finished_at: datetime | None = None
        self.output: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.usage = Usage()
        # of ``usage``, the tokens used before this worker took the run (its checkpoint's):
        # charged to the budgets by the workers that used them, or by their reservations
        self.usage_before = 0
        self.seq = 0
        self.encoder = WireEncoder(run_id, session_id)
        self.task: asyncio.Task[None] | None = None
        self.task_cancelled = False
        self.in_runtime = False
        # an event the runtime emitted is on its way to the log and awaited (``RunDriver``)
        self.appending = False
        self.finalizing = False
        self.cancel_reason: str | None = None
        self._done = False
        self._finished: asyncio.Future[None] | None = None
        self.t_accepted = time.monotonic()
        self.t_first_event: float | None = None
        # messages the session held when the run was admitted; 0 spares reading them back
        self.history_size = -1
        # the session did not exist at admission: the run's record creates it (one write)
        self.new_session = False
        # the run's log and route were opened with its lease (``Bus.claim_run``)
        self.opened = False
        # the write of the run's record, which runs beside the run's start (see
        # app.runs.records), then whether it was stored: a done task would keep its coroutine
        self.recorded: asyncio.Task[None] | bool | None = None
        self.lease_deadline = lease_deadline
        self.fenced = False
        self._fenced_off: asyncio.Future[None] | None = None
        # ids of the tool calls executing now (shared bus: what a fence-off leaves running)
        self._tools_running: set[str] | None = None
        # the step of the run's last stored checkpoint (None: none yet; app.runs.checkpoints)
        self.checkpoint_step: int | None = None
        # a run resumed here: the stored checkpoint it continues from (app.runs.resume)
        self.resumed_from: CheckpointRecord | None = None
        # true while the runtime waits for an external answer (an answer may wait for it,
        # ``until_asking``)
        self.asking = False
        self._ask_waiter: asyncio.Future[None] | None = None
        # whether it has waited for one on this worker (a resumed run asks its question again)
        self.asked = False

    @property
    def agent(self) -> str:
        """The name of the run's agent."""
        return self.profile.name

    @property
    def input(self) -> str:
        """The run's input as text (``RunRequestOptions.input``)."""
        return self.options.input

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The request's metadata (read-only: the request's own mapping, not a copy)."""
        return self.options.metadata

    def ask(self) -> None:
        """The runtime waits for an external answer now."""
        self.asked = True
        self.asking = True
        waiter, self._ask_waiter = self._ask_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def until_asking(self) -> asyncio.Future[None]:
        """Resolved once the runtime waits for an external answer (at once if it does now)."""
        if self._ask_waiter is None:
            self._ask_waiter = asyncio.get_running_loop().create_future()
        waiter = self._ask_waiter
        if self.asking and not waiter.done():
            waiter.set_result(None)
        return waiter

    @property
    def finished(self) -> asyncio.Future[None]:
        """Resolved once the run is over here: its terminal event appended, or handed over."""
        if self._finished is None:
            self._finished = asyncio.get_running_loop().create_future()
            if self._done:
                self._finished.set_result(None)
        return self._finished

    def finish(self) -> None:
        """The run is over here (``finished``, ``done``). Idempotent."""
        self._done = True
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    @property
    def fenced_off(self) -> asyncio.Future[None]:
        """Resolved once the run was fenced off (its streams end on it)."""
        if self._fenced_off is None:
            self._fenced_off = asyncio.get_running_loop().create_future()
            if self.fenced:
                self._fenced_off.set_result(None)
        return self._fenced_off

    def fence(self) -> None:
        """Mark the run fenced off (``fenced``, ``fenced_off``)."""
        self.fenced = True
        if self._fenced_off is not None and not self._fenced_off.done():
            self._fenced_off.set_result(None)

    @property
    def tools_running(self) -> frozenset[str] | set[str]:
        """Ids of the tool calls executing now (with a tool gate: the shared bus)."""
        return _NONE_RUNNING if self._tools_running is None else self._tools_running

    def tool_started(self, call_id: str) -> None:
        """A tool call starts (``tools_running``), until ``tool_finished``."""
        if self._tools_running is None:
            self._tools_running = set()
        self._tools_running.add(call_id)

    def tool_finished(self, call_id: str | None) -> bool:
        """A tool call's result came; False if it was not known to be running."""
        running = self._tools_running
        if running is None or call_id not in running:
            return False
        running.discard(call_id)
        if not running:
            self._tools_running = None
        return True

    @property
    def settling(self) -> bool:
        """True while a run resumed here has not yet asked again the question it was waiting
        on: an answer to it is to be posted again (it is not refused)."""
        return self.resumed_from is not None and not self.asked and not self.done

    def spent_here(self) -> int:
        """Tokens the run used on this worker: what its end charges to its budgets."""
        return max(0, self.usage.input_tokens + self.usage.output_tokens - self.usage_before)

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id} session={self.session_id} status={self.status}>"

    @property
    def done(self) -> bool:
        """True once the terminal event was appended (or the run handed over)."""
        return self._done

    def view(self, status: RunStatus) -> dict[str, Any]:
        """``GET /v1/runs/{id}``, with the status as the caller sees it now."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "agent": self.agent,
            "input": self.input,
            "input_parts": stored_parts(self.options.parts),
            "status": status,
            "queue_position": None,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "output": self.output,
            "error": self.error,
            "usage": self.usage.to_dict(),
            "model": self.usage.model,
            "metadata": dict(self.metadata),
            "events_url": f"/v1/runs/{self.run_id}/events",
        }

    def result(self) -> dict[str, Any]:
        """The JSON answer of a blocking run."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
            "usage": self.usage.to_dict(),
        }


def stored_parts(parts: Sequence[ContentPart]) -> list[dict[str, Any]] | None:
    """The JSON form of a run's input parts, as its record keeps them (None: no parts)."""
    return [part_to_dict(part) for part in parts] if parts else None


def record_view(record: RunRecord) -> dict[str, Any]:
    """``GET /v1/runs/{id}`` for a stored run."""
    return {
        "run_id": record.run_id,
        "session_id": record.session_id,
        "agent": record.agent,
        "input": record.input,
        "input_parts": list(record.input_parts) if record.input_parts else None,
        "status": record.status,
        "queue_position": None,
        "created_at": _iso(record.created_at),
        "started_at": _iso(record.started_at),
        "finished_at": _iso(record.finished_at),
        "output": record.output,
        "error": record.error,
        "usage": record.usage,
        "model": record.model,
        "metadata": record.metadata,
        "events_url": f"/v1/runs/{record.run_id}/events",
    }
