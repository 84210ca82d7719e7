"""What a run start does while its session has an active run (``multitask_strategy``).

::

    reject     409 session_busy (the default)
    enqueue    wait behind the active run, first come first served per session, across
               workers (``app.bus.queue``); bounded by AGENT_MAX_SESSION_QUEUE (then 429)
    interrupt  cancel the active run (reason ``superseded``: its turn is kept, stopped), then
               start, ahead of any queued run
    rollback   the same, and the superseded run's turn is removed before the new run reads
               the conversation

A queued run waits without an admission slot and without a record: it lives as a queue entry
(``GET /v1/runs/{id}`` shows it ``queued`` with its ``queue_position``) renewed by the worker
that accepted it. When it is at the front and the session's lock is free, that worker takes
the lock for it, claims the entry and starts it as any run (admission, record, log, task). A
cancelled queued run is recorded ``cancelled`` by whoever cancelled it; a queued run whose
worker dies lapses from the line and is forgotten.

Confirmations pending on a superseded run are withdrawn: before its ``run.cancelled``, a
``custom`` ``confirmation_resolved`` with ``outcome: superseded`` for each (``withdrawn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, Protocol

from agent_runtime.model import Usage
from app.bus.base import BusError, Lease, LogNotFound
from app.bus.queue import LocalSessionQueue, QueueEntry, SessionQueue
from app.bus.wire import iso_ms
from app.errors import Conflict, Draining, NotFound, Overloaded, ServiceError, SessionBusy
from app.runs.context import RunContext
from app.runs.handle import Outcome, RunHandle, RunRequestOptions, new_run_id, stored_parts
from app.storage import RunRecord, RunStatus, SessionOwnedByOther, StorageError

__all__ = [
    "STRATEGIES",
    "Multitask",
    "QueuedRun",
    "session_queue",
    "withdraw_confirmations",
    "withdrawn_confirmations",
]

logger = logging.getLogger("app.runs")

STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")

SUPERSEDED = "superseded"

_RETRY_AFTER_QUEUE_FULL = 1.0


class StartFn(Protocol):
    """``Starter.start``."""

    def __call__(
        self,
        principal: str,
        session_id: str,
        options: RunRequestOptions,
        *,
        run_id: str | None = None,
        lease: Lease | None = None,
    ) -> Awaitable[RunHandle]: ...


class _Dequeued(Exception):
    """The entry left the line without being claimed (cancelled, or lapsed)."""


class _Enqueue(SessionBusy):
    """An ``enqueue`` start found the session busy: it goes in line (not a refusal)."""


class QueuedRun:
    """What a background start answers when its run waits in the session's queue."""

    __slots__ = ("entry", "position")

    def __init__(self, entry: QueueEntry, position: int) -> None:
        self.entry = entry
        self.position = position

    @property
    def run_id(self) -> str:
        return self.entry.run_id


def queued_view(entry: QueueEntry, position: int | None) -> dict[str, Any]:
    """``GET /v1/runs/{id}`` for a run waiting in its session's queue."""
    return {
        "run_id": entry.run_id,
        "session_id": entry.session_id,
        "agent": entry.agent,
        "input": entry.input,
        "input_parts": entry.input_parts,
        "status": "queued",
        "queue_position": position,
        "created_at": iso_ms(entry.created_at),
        "started_at": None,
        "finished_at": None,
        "output": None,
        "error": None,
        "usage": Usage().to_dict(),
        "model": None,
        "metadata": entry.metadata,
        "events_url": f"/v1/runs/{entry.run_id}/events",
    }


class Multitask:
    """The strategies, and this worker's queued background runs."""

    def __init__(
        self,
        context: RunContext,
        queue: SessionQueue,
        start: StartFn,
        *,
        max_queue: int,
        poll: float = 0.05,
    ) -> None:
        self._context = context
        self.queue = queue
        self._start = start
        self._max_queue = max_queue
        self._poll = poll
        self._waiters: dict[str, asyncio.Task[None]] = {}
        self._inline = 0
        # when each queued run's lock request was sent: its lease deadline counts from then
        self._sent: dict[str, float] = {}

    @property
    def waiting(self) -> int:
        """Runs this worker keeps queued (background, and streaming or blocking requests)."""
        return len(self._waiters) + self._inline

    def lease_sent(self, run_id: str) -> float:
        """When the lock request of ``run_id``'s lease was sent (the start takes it over);
        unknown: a deadline already due, so that a lease of unknown age is never trusted."""
        sent = self._sent.pop(run_id, None)
        return sent if sent is not None else self._context.clock() - self._context.lease_ttl

    # --- starting ---------------------------------------------------------------------------

    async def start(
        self, principal: str, session_id: str, options: RunRequestOptions
    ) -> RunHandle | QueuedRun:
        """Start a run by its strategy: a handle, or the queued run (``enqueue``, background).

        ``enqueue`` of a streaming or blocking run waits in line within the request.
        """
        if options.multitask_strategy != "enqueue":
            return await self._start(principal, session_id, options)
        queue = self.queue
        if not await queue.length(session_id):
            try:
                return await self._start(principal, session_id, options)
            except _Enqueue:
                pass
        else:
            await self._owned(principal, session_id)
        entry = QueueEntry(
            run_id=new_run_id(),
            session_id=session_id,
            principal=principal,
            agent=options.agent,
            input=options.input,
            created_at=time.time(),
            metadata=dict(options.metadata),
            input_parts=stored_parts(options.parts),
        )
        position = await queue.push(
            entry, front=False, limit=self._max_queue, ttl=self._context.lease_ttl
        )
        if position is None:
            self._context.reject("session_queue_full")
            raise Overloaded(
                f"session {session_id!r} already has {self._max_queue} queued runs; wait for "
                "them to start",
                retry_after=_RETRY_AFTER_QUEUE_FULL,
            )
        if options.background:
            task = asyncio.get_running_loop().create_task(
                self._wait_then_start(entry, options), name=f"queued {entry.run_id}"
            )
            self._waiters[entry.run_id] = task
            task.add_done_callback(lambda _: self._waiters.pop(entry.run_id, None))
            return QueuedRun(entry, position)
        self._inline += 1
        try:
            lease = await self._wait_turn(entry, timeout=None)
        except _Dequeued:
            raise SessionBusy(
                f"the queued run lost its place in session {session_id!r}; start it again"
            ) from None
        except BaseException:
            await asyncio.shield(queue.cancel(session_id, entry.run_id))
            raise
        finally:
            self._inline -= 1
        return await self._start_claimed(entry, options, lease)

    async def on_busy(
        self,
        principal: str,
        session_id: str,
        run_id: str,
        active: str | None,
        options: RunRequestOptions,
    ) -> tuple[Lease | None, str | None]:
        """For ``interrupt`` and ``rollback``: supersede the active run, wait for the lock
        (ahead of any queued run, up to the queue timeout); the lease and the superseded run's
        id. ``(None, None)`` for ``reject``: the start is refused as busy."""
        if options.multitask_strategy == "enqueue":
            raise _Enqueue(f"session {session_id!r} is busy: the run waits in line")
        if options.multitask_strategy not in ("interrupt", "rollback"):
            return None, None
        if options.replaces is not None and options.replaces != active:
            # checked before anything is superseded: only the active run would be the latest
            raise Conflict(
                f"run {options.replaces!r} is not the latest run of session {session_id!r}: "
                "only the last turn can be replaced",
                code="turn_not_latest",
            )
        context = self._context
        entry = QueueEntry(
            run_id=run_id,
            session_id=session_id,
            principal=principal,
            agent=options.agent,
            input=options.input,
            created_at=time.time(),
            metadata=dict(options.metadata),
            input_parts=stored_parts(options.parts),
        )
        queue = self.queue
        await queue.push(entry, front=True, limit=None, ttl=context.lease_ttl)
        superseded = active if active is not None and active.startswith("run_") else None
        try:
            if superseded is not None:
                await context.bus.router.cancel(superseded, SUPERSEDED)
            lease = await self._wait_turn(entry, timeout=context.queue_timeout)
        except _Dequeued:
            return None, None
        except BaseException:
            await asyncio.shield(queue.cancel(session_id, run_id))
            raise
        logger.info(
            "run superseded",
            extra={"run_id": superseded, "session_id": session_id, "by": run_id},
        )
        return lease, superseded

    async def _wait_turn(self, entry: QueueEntry, *, timeout: float | None) -> Lease:  # noqa: ASYNC109
        """Wait until the entry is at the front and the session's lock is free; the lease,
        with the entry claimed. Raises ``_Dequeued``, or ``SessionBusy`` after ``timeout``."""
        context = self._context
        queue = self.queue
        locks = context.bus.locks
        session_id, run_id = entry.session_id, entry.run_id
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            position = await queue.turn(session_id, run_id, context.lease_ttl)
            if position is None:
                raise _Dequeued
            if position == 1:
                self._sent[run_id] = context.clock()
                lease = await locks.acquire(session_id, run_id, context.lease_ttl)
                if lease is None:
                    del self._sent[run_id]
                else:
                    if await queue.claim(session_id, run_id):
                        return lease
                    del self._sent[run_id]
                    await locks.release(lease)
                    raise _Dequeued
            if deadline is not None and loop.time() >= deadline:
                await queue.cancel(session_id, run_id)
                context.reject("session_busy")
                active = await locks.holder(session_id)
                if active is not None and not active.startswith("run_"):
                    active = None
                raise SessionBusy(
                    f"session {session_id!r} still has an active run; it did not end in time",
                    extra={"active_run_id": active},
                )
            await asyncio.sleep(self._poll)

    async def _start_claimed(
        self, entry: QueueEntry, options: RunRequestOptions, lease: Lease
    ) -> RunHandle:
        """Start the claimed entry's run with the lease taken for it; ``NotFound`` if its
        session was deleted while it waited (a queued run does not bring it back)."""
        try:
            if await self._context.store.get_session(entry.session_id) is None:
                raise NotFound(f"session {entry.session_id!r} was deleted while the run waited")
            return await self._start(
                entry.principal, entry.session_id, options, run_id=entry.run_id, lease=lease
            )
        except BaseException:
            if entry.run_id not in self._context.runs:  # refused before it was held
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._context.bus.locks.release(lease))
            raise
        finally:
            self.queue.forget_claim(entry.run_id)

    async def _wait_then_start(self, entry: QueueEntry, options: RunRequestOptions) -> None:
        """A queued background run's waiter: its turn, then its start."""
        try:
            lease = await self._wait_turn(entry, timeout=None)
        except _Dequeued:
            return  # cancelled: its canceller recorded it
        except asyncio.CancelledError:
            if await asyncio.shield(self.queue.cancel(entry.session_id, entry.run_id)):
                await asyncio.shield(self._record_end(entry, "cancelled"))
            raise
        except Exception as exc:
            logger.warning("a queued run lost its place: %s", exc, extra={"run_id": entry.run_id})
            if await self._cancel_quietly(entry):
                await self._record_end(entry, "failed", _error("unavailable", str(exc)))
            return
        try:
            await self._start_claimed(entry, options, lease)
        except Draining:
            await self._record_end(entry, "cancelled")
        except ServiceError as exc:
            await self._record_end(entry, "failed", _error(exc.code, str(exc)))
        except Exception:
            logger.exception("a queued run could not start", extra={"run_id": entry.run_id})
            await self._record_end(entry, "failed", _error("internal", "the run could not start"))

    async def _cancel_quietly(self, entry: QueueEntry) -> bool:
        try:
            return await self.queue.cancel(entry.session_id, entry.run_id)
        except BusError:
            return False

    async def _owned(self, principal: str, session_id: str) -> None:
        try:
            await self._context.store.get_or_create_session(session_id, principal)
        except SessionOwnedByOther:
            raise NotFound(f"no session {session_id!r}") from None

    async def _record_end(
        self, entry: QueueEntry, status: RunStatus, error: dict[str, Any] | None = None
    ) -> None:
        """Store the end of a queued run that never started (best effort)."""
        store = self._context.store
        record = RunRecord(
            run_id=entry.run_id,
            session_id=entry.session_id,
            principal=entry.principal,
            agent=entry.agent,
            input=entry.input,
            created_at=datetime.fromtimestamp(entry.created_at, UTC),
            metadata=entry.metadata,
            input_parts=tuple(entry.input_parts or ()),
        )
        try:
            await store.create_run(record)
            await store.update_run(entry.run_id, status=status, error=error)
        except (StorageError, ServiceError) as exc:
            logger.warning(
                "could not store the end of a queued run: %s", exc, extra={"run_id": entry.run_id}
            )

    # --- reading and cancelling -------------------------------------------------------------

    async def view(self, run_id: str, principal: str) -> dict[str, Any] | None:
        """``GET /v1/runs/{id}`` of the caller's queued run; None if there is none."""
        state = await self.queue.state(run_id)
        if state is None or state.entry.principal != principal:
            return None
        return queued_view(state.entry, state.position)

    async def wait_dequeued(self, run_id: str) -> None:
        """Return once the run no longer waits in its session's queue (it started, or was
        cancelled or lapsed); a reader of its events follows it from then on."""
        while True:
            state = await self.queue.state(run_id)
            if state is None or state.position is None:
                return
            await asyncio.sleep(self._poll)

    async def cancel(self, run_id: str, principal: str) -> tuple[str, RunStatus] | None:
        """Cancel the caller's queued run; None if there is none. ``("claimed", "queued")``
        when it is being started right now (cancel it as a run, once it is one)."""
        state = await self.queue.state(run_id)
        if state is None or state.entry.principal != principal:
            return None
        entry = state.entry
        if state.position is not None and await self.queue.cancel(entry.session_id, run_id):
            await self._record_end(entry, "cancelled")
            logger.info("queued run cancelled", extra={"run_id": run_id})
            return "cancelling", "cancelled"
        return "claimed", "queued"

    async def aclose(self) -> None:
        """Stop this worker's queued background runs (recorded cancelled)."""
        tasks = list(self._waiters.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


async def withdraw_confirmations(context: RunContext, handle: RunHandle, outcome: Outcome) -> None:
    """Before a superseded run's ``run.cancelled``: ``confirmation_resolved`` with outcome
    ``superseded`` for each confirmation it left pending."""
    if outcome.status != "cancelled" or outcome.data.get("reason") != SUPERSEDED:
        return
    for call_id in await withdrawn_confirmations(context, handle):
        handle.seq += 1
        data = {
            "name": "confirmation_resolved",
            "payload": {"tool_call_id": call_id, "outcome": SUPERSEDED},
        }
        wire = handle.encoder.encode(handle.seq, "custom", time.time(), data)
        try:
            await context.events.append(handle.run_id, wire, fence=handle.lease.token)
        except BusError:
            logger.warning("could not withdraw a confirmation", extra={"run_id": handle.run_id})


def session_queue(bus: object) -> SessionQueue:
    """The bus's session queues (``queues``); the in-process ones for a bus without."""
    queues = getattr(bus, "queues", None)
    return queues if queues is not None else LocalSessionQueue()


async def withdrawn_confirmations(context: RunContext, handle: RunHandle) -> list[str]:
    """The ids of the tool calls whose confirmation the run requested and never resolved."""
    pending: dict[str, None] = {}
    try:
        subscription = await context.events.subscribe(handle.run_id, after=0)
    except LogNotFound:
        return []
    try:
        async with asyncio.timeout(5):
            while subscription.cursor < handle.seq:
                batch = await subscription.next()
                if not batch:
                    break
                for event in batch:
                    if event.type != "custom":
                        continue
                    data = event.document["data"]
                    call_id = data.get("payload", {}).get("tool_call_id")
                    if not isinstance(call_id, str):
                        continue
                    if data.get("name") == "confirmation_requested":
                        pending[call_id] = None
                    elif data.get("name") == "confirmation_resolved":
                        pending.pop(call_id, None)
    except (TimeoutError, BusError):
        logger.warning("could not read the confirmations of a superseded run", exc_info=True)
    finally:
        await subscription.aclose()
    return list(pending)
