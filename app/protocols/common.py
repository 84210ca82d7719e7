"""What every protocol translation shares: starting a run through the run manager, finding a
session's run, reading its log, answering its confirmations, and streaming it in a protocol's
own frames.

A protocol module (``app.protocols.agui``, ``app.protocols.ai_sdk``, ...) is a thin layer: it
turns a request of its protocol into ``RunRequestOptions`` or an answer, and the run's wire
events into its protocol's frames with a ``FrameEncoder``. Runs, admission, auth, sessions and
event logs are the native API's own, so a protocol stream resumes and survives a worker
hand-over exactly as ``GET /v1/runs/{id}/events`` does.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESOLVED,
    CONFIRMATION_RESPONSE,
)
from app.api.streaming import EventStreamResponse, FrameEncoder
from app.bus.base import BusError, LogNotFound, Router, WireEvent
from app.errors import NotFound, SessionBusy
from app.runs import RunHandle, RunRequestOptions
from app.services import Services

__all__ = [
    "SSE_HEADERS",
    "Confirmation",
    "LoggedRun",
    "active_run",
    "answer_confirmation",
    "busy_reason",
    "disconnect_policy",
    "event_data",
    "latest_run",
    "read_log",
    "start_run",
    "stream_run",
]

logger = logging.getLogger("app.protocols")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


_DATA_KEY = b',"data":'


def event_data(event: WireEvent) -> dict[str, Any]:
    """The ``data`` object of a wire event (decoded; the hot text path never needs it)."""
    frame = event.frame
    start = frame.find(_DATA_KEY)
    if start < 0:  # pragma: no cover - every wire frame has its data member last
        return {}
    value = json.loads(frame[start + len(_DATA_KEY) : frame.rindex(b"}")])
    return value if isinstance(value, dict) else {}


async def start_run(
    services: Services, principal: str, session_id: str, options: RunRequestOptions
) -> RunHandle:
    """Admit and start a run, exactly as ``POST /v1/sessions/{id}/runs`` does."""
    return await services.manager.start(principal, session_id, options)


# cancellations sent to another worker after a disconnect, held until they are delivered
_routed: set[asyncio.Task[bool]] = set()


def disconnect_policy(services: Services, run_id: str, policy: str) -> Callable[[], None] | None:
    """What a streaming client's disconnect does to the run: cancel it, or nothing.

    A stream that continues a run (a resume, an approval) may be served by a worker other than
    the run's: the cancellation then goes through the bus to the worker that holds it.
    """
    if policy != "cancel":
        return None
    manager = services.manager
    router = services.bus.router

    def cancel() -> None:
        if manager.local(run_id) is not None:
            manager.cancel_local(run_id, "client_disconnected")
            return
        task = asyncio.get_running_loop().create_task(_route_cancel(router, run_id))
        _routed.add(task)
        task.add_done_callback(_routed.discard)

    return cancel


async def _route_cancel(router: Router, run_id: str) -> bool:
    try:
        return await router.cancel(run_id, "client_disconnected")
    except BusError as exc:
        logger.warning("could not cancel run %s after a disconnect: %s", run_id, exc)
        return False


def stream_run(
    services: Services,
    run_id: str,
    encoder: FrameEncoder,
    *,
    after: int = 0,
    on_gone: Callable[[], object] | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventStreamResponse:
    """The run's log from ``after``, in the encoder's frames."""
    return EventStreamResponse(
        events=services.bus.events,
        run_id=run_id,
        after=after,
        headers={**SSE_HEADERS, "X-Run-Id": run_id, **(headers or {})},
        ping=services.settings.sse_ping,
        send_timeout=services.settings.send_timeout,
        on_gone=on_gone,
        manager=services.manager,
        encoder=encoder,
    )


async def active_run(services: Services, session_id: str, principal: str) -> str | None:
    """The id of the session's active run (on any worker) if the caller owns it."""
    holder = await services.bus.locks.holder(session_id)
    if holder is None or not holder.startswith("run_"):
        return None  # idle, or held for a moment by a deletion or the lost-run sweep
    found = await services.manager.find(holder, principal)
    if found is None or found.session_id != session_id:
        return None
    return holder


async def latest_run(services: Services, session_id: str, principal: str) -> str | None:
    """The session's active run, else its most recent one; None if it has none (or is not
    the caller's)."""
    active = await active_run(services, session_id, principal)
    if active is not None:
        return active
    session = await services.store.get_session(session_id)
    if session is None or session.principal != principal:
        return None
    runs = await services.store.list_runs(session_id, 1)
    return runs[0].run_id if runs else None


async def busy_reason(services: Services, exc: SessionBusy, principal: str) -> str:
    """``interrupt_pending`` when the session's active run waits for an answer, else
    ``session_busy``."""
    active = exc.extra.get("active_run_id")
    if not isinstance(active, str):
        return "session_busy"
    found = await services.manager.find(active, principal)
    status: str | None = None
    if isinstance(found, RunHandle):
        status = services.manager.live_status(found)
    elif found is not None:
        status = found.status
    return "interrupt_pending" if status == "waiting" else "session_busy"


@dataclass
class Confirmation:
    """One confirmation a run asked for, as its log tells it."""

    tool_call_id: str
    seq: int
    payload: dict[str, Any]
    outcome: str | None = None  # approved, denied or expired, once resolved


@dataclass
class LoggedRun:
    """What a run's log holds so far: its model, confirmations and whether it ended."""

    run_id: str
    last_seq: int = 0
    model: str | None = None
    ended: bool = False
    confirmations: dict[str, Confirmation] = field(default_factory=dict)

    def pending(self) -> list[Confirmation]:
        """The confirmations still waiting for an answer."""
        if self.ended:
            return []
        return [c for c in self.confirmations.values() if c.outcome is None]


async def read_log(services: Services, run_id: str) -> LoggedRun:
    """Everything the run's log holds now (replayed once; raises ``NotFound`` once it expired)."""
    events = services.bus.events
    logged = LoggedRun(run_id)
    last = await events.last_seq(run_id)
    if last is None:
        raise NotFound(f"the events of run {run_id!r} are no longer kept (they expired)")
    if last == 0:
        return logged
    try:
        subscription = await events.subscribe(run_id, 0)
    except LogNotFound:
        raise NotFound(f"the events of run {run_id!r} are no longer kept") from None
    try:
        while subscription.cursor < last:
            batch = await subscription.next()
            if not batch:  # finished (nothing interrupts this reader)
                break
            _absorb(logged, batch)
    finally:
        await subscription.aclose()
    return logged


def _absorb(logged: LoggedRun, batch: Sequence[WireEvent]) -> None:
    for event in batch:
        logged.last_seq = event.seq
        if event.type == "run.started":
            model = event_data(event).get("model")
            logged.model = model if isinstance(model, str) else None
        elif event.type == "custom":
            data = event_data(event)
            payload = data.get("payload")
            if not isinstance(payload, dict):
                continue
            call_id = payload.get("tool_call_id")
            if not isinstance(call_id, str):
                continue
            if data.get("name") == CONFIRMATION_REQUESTED:
                logged.confirmations[call_id] = Confirmation(call_id, event.seq, payload)
            elif data.get("name") == CONFIRMATION_RESOLVED and call_id in logged.confirmations:
                outcome = payload.get("outcome")
                logged.confirmations[call_id].outcome = (
                    outcome if isinstance(outcome, str) else "denied"
                )
        elif event.terminal:
            logged.ended = True


async def answer_confirmation(
    services: Services,
    principal: str,
    session_id: str,
    run_id: str,
    tool_call_id: str,
    approved: bool,
) -> bool:
    """Deliver an approval or a denial to the waiting run, exactly as ``POST /external-events``
    does (the run holds the call; the answer cannot change it). False if no run took it."""
    accepted = await services.manager.external_event(
        principal,
        session_id,
        run_id,
        CONFIRMATION_RESPONSE,
        {"tool_call_id": tool_call_id, "approved": approved},
    )
    return bool(accepted)
