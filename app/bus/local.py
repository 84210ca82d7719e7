"""The in-process bus: everything lives in this worker's memory, on its event loop.

Right for one worker (the default). With several workers and no Redis, each worker has its
own: a run's events, cancellation and answers are reachable only on the worker that runs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from agent_runtime.extensions.external import ExternalEvent
from app.bus.base import (
    BusError,
    CommandHandler,
    DirectOffers,
    Lease,
    LeaseLost,
    LogNotFound,
    WireEvent,
)
from app.bus.queue import LocalSessionQueue

__all__ = ["LocalBus", "LocalEventLog", "LocalRouter", "LocalSessionLocks", "LocalValues"]

_EMPTY: tuple[WireEvent, ...] = ()
# the most events one ``next`` hands out: a reader that is far behind (a backlog, a stalled
# client) holds a bounded slice of the log, not a copy of everything after its cursor
BATCH_EVENTS = 512


class _RunLog:
    __slots__ = (
        "events",
        "expiry",
        "fence",
        "first_seq",
        "last_seq",
        "restarted_after",
        "run_id",
        "sealed",
        "session_id",
        "waiters",
    )

    def __init__(self, run_id: str, session_id: str, fence: int) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.fence = fence
        self.events: list[WireEvent] = []
        self.first_seq = 1  # seq of events[0]
        self.last_seq = 0
        # a log begun again after a restart of the process (``skip_to``): the seq it goes on
        # after; the seqs above it that a reader saw may have been the lost log's
        self.restarted_after: int | None = None
        self.sealed = False
        # readers waiting for the next event; None while there are none (most logs, most of
        # the time: a run waiting for an answer may have no reader for hours)
        self.waiters: set[_LocalSubscription] | None = None
        self.expiry: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        waiters = self.waiters
        if waiters:
            self.waiters = None
            kept: set[_LocalSubscription] | None = None
            for subscription in waiters:
                waiter = subscription._waiter
                if waiter is None or waiter.done():
                    continue
                if subscription.direct is not None and subscription._deliver_direct():
                    # handed over at once: the reader goes on waiting for the next event
                    if kept is None:
                        kept = set()
                    kept.add(subscription)
                    continue
                waiter.set_result(None)
            # (nothing above can add a waiter: a direct reader only writes)
            self.waiters = kept


class _LocalSubscription(DirectOffers):
    __slots__ = ("_closed", "_finished", "_interrupted", "_log", "_owner", "_waiter")

    def __init__(self, owner: LocalEventLog, log: _RunLog, after: int) -> None:
        self._owner = owner
        self._log = log
        super().__init__(after)
        self._finished = False
        self._interrupted = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def finished(self) -> bool:
        return self._finished

    async def next(self) -> Sequence[WireEvent]:
        log = self._log
        while not self._closed:
            events = log.events
            index = self._cursor + 1 - log.first_seq
            if index < 0:  # older events were dropped (bounded log): resume at the oldest kept
                index = 0
            if index < len(events):
                batch = events[index : index + BATCH_EVENTS]
                self._cursor = batch[-1].seq
                if log.sealed and self._cursor >= log.last_seq:
                    self._finished = True
                return batch
            if log.sealed:
                self._finished = True
                return _EMPTY
            if self._interrupted:
                self._interrupted = False
                return _EMPTY
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            if log.waiters is None:
                log.waiters = set()
            log.waiters.add(self)
            try:
                await waiter
            finally:
                self._waiter = None
                if log.waiters is not None:
                    log.waiters.discard(self)
            if self._take_interrupt() and self._cursor >= log.last_seq:
                return _EMPTY
        return _EMPTY

    def _deliver_direct(self) -> bool:
        """Hand the events after the cursor to ``direct`` while ``next`` waits (an append's
        wake-up, in the writer's task); True if it took them."""
        log = self._log
        if self.direct is None or log.sealed or self._interrupted or self._closed:
            return False
        index = self._cursor + 1 - log.first_seq
        events = log.events
        if index < 0 or index >= len(events):
            return False
        return self._offer(events[index : index + BATCH_EVENTS], log.run_id)

    def _take_interrupt(self) -> bool:
        interrupted, self._interrupted = self._interrupted, False
        return interrupted

    def interrupt(self) -> None:
        self._interrupted = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._log.waiters is not None:
                self._log.waiters.discard(self)
            self._owner._subscribers -= 1
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class LocalEventLog:
    """Event logs in a dict. ``ttl``: seconds a sealed log is kept; ``max_events`` per run."""

    def __init__(
        self, *, ttl: float = 600.0, max_events: int = 100_000, max_retained: int = 1_000_000
    ) -> None:
        self.ttl = ttl
        self.max_events = max_events
        # finished logs kept for replay hold at most this many events in total: past it the
        # oldest finished logs go before their TTL (memory stays bounded under load)
        self.max_retained = max_retained
        self._sealed: dict[str, int] = {}  # run id -> events, in sealing order
        self._retained = 0
        # trim in steps, so that a long run does not shift its list at every event
        self._trim_slack = max(16, max_events // 8)
        self._logs: dict[str, _RunLog] = {}
        self._subscribers = 0

    async def create(
        self, run_id: str, *, session_id: str, fence: int, after: int | None = None
    ) -> None:
        if run_id in self._logs:
            raise BusError(f"run {run_id!r} already has an event log")
        self._logs[run_id] = _RunLog(run_id, session_id, fence)
        if after is not None:  # begun again, after 0 too (a checkpoint before any event)
            self.skip_to(run_id, after)

    async def append(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        self.append_nowait(run_id, event, fence=fence)

    def skip_to(self, run_id: str, seq: int) -> None:
        """Make an empty log go on after ``seq``: a run resumed after a restart of the
        process keeps its seq rising, though its earlier events were lost with the process.
        A reader whose cursor is past ``seq`` reads it from its start (``subscribe``)."""
        log = self._logs.get(run_id)
        if log is None:
            raise LogNotFound(run_id)
        if log.events or log.sealed:
            raise BusError(f"the log of run {run_id!r} is not empty")
        log.first_seq = seq + 1
        log.last_seq = seq
        log.restarted_after = seq

    def append_nowait(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """``append`` without a coroutine: the local log never waits."""
        log = self._logs.get(run_id)
        if log is None:
            raise LogNotFound(run_id)
        if fence < log.fence:
            raise LeaseLost(f"stale fencing token for run {run_id!r}")
        log.fence = fence
        if log.sealed:
            raise BusError(f"the log of run {run_id!r} is sealed: its terminal event was sent")
        if event.seq != log.last_seq + 1:
            raise BusError(f"run {run_id!r}: event seq {event.seq} does not follow {log.last_seq}")
        events = log.events
        events.append(event)
        log.last_seq = event.seq
        if len(events) > self.max_events + self._trim_slack:
            drop = len(events) - self.max_events
            del events[:drop]
            log.first_seq += drop
        if event.terminal:
            log.sealed = True
            log.expiry = asyncio.get_running_loop().call_later(self.ttl, self._expire, run_id)
            self._sealed[run_id] = len(events)
            self._retained += len(events)
            while self._retained > self.max_retained and len(self._sealed) > 1:
                self._expire(next(iter(self._sealed)))
        log.wake()

    async def subscribe(self, run_id: str, after: int = 0) -> _LocalSubscription:
        log = self._logs.get(run_id)
        if log is None:
            raise LogNotFound(run_id)
        restarted = log.restarted_after
        if restarted is not None and after > restarted:
            # A cursor past the point a restarted log goes on from may count events of the
            # log lost with the process, numbered as this one numbers others: read this log
            # from its start (its run.resumed says which of the reader's text to drop).
            after = restarted
        self._subscribers += 1
        return _LocalSubscription(self, log, max(0, after))

    async def exists(self, run_id: str) -> bool:
        return run_id in self._logs

    async def last_seq(self, run_id: str) -> int | None:
        log = self._logs.get(run_id)
        return None if log is None else log.last_seq

    async def terminal_seq(self, run_id: str) -> int | None:
        log = self._logs.get(run_id)
        return log.last_seq if log is not None and log.sealed else None

    def _expire(self, run_id: str) -> None:
        log = self._logs.pop(run_id, None)
        if log is not None and log.expiry is not None:
            log.expiry.cancel()
        self._retained -= self._sealed.pop(run_id, 0)

    def discard(self, run_id: str) -> None:
        """Forget a log at once (a run that never started)."""
        self._expire(run_id)

    @property
    def subscribers(self) -> int:
        """Open subscriptions."""
        return self._subscribers

    @property
    def logs(self) -> int:
        """Logs held (live and sealed)."""
        return len(self._logs)

    @property
    def live_logs(self) -> int:
        """Logs not yet sealed."""
        return sum(1 for log in self._logs.values() if not log.sealed)

    def close(self) -> None:
        """Drop every log and its expiry timer."""
        for log in self._logs.values():
            if log.expiry is not None:
                log.expiry.cancel()
            log.wake()
        self._logs.clear()
        self._sealed.clear()
        self._retained = 0


class LocalSessionLocks:
    """Session locks in a dict. A lease held in-process cannot outlive its holder, so the
    ``ttl`` is not enforced; tokens still grow with every acquisition."""

    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}
        self._token = 0

    async def acquire(
        self, session_id: str, holder: str, ttl: float, *, exclusive: bool = False
    ) -> Lease | None:
        if session_id in self._held:
            return None
        self._token += 1
        lease = Lease(session_id, holder, self._token)
        self._held[session_id] = lease
        return lease

    async def renew(self, lease: Lease, ttl: float) -> None:
        if self._held.get(lease.session_id) != lease:
            raise LeaseLost(f"the lock of session {lease.session_id!r} is not held by this lease")

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[bool]:
        renewed: list[bool] = []
        for lease in leases:
            try:
                await self.renew(lease, ttl)
            except LeaseLost:
                renewed.append(False)
            else:
                renewed.append(True)
        return renewed

    def advance(self, lease: Lease, token: int) -> Lease:
        """The held ``lease`` with its token raised to ``token``: this process's tokens start
        again at 1, below those a previous process stored (a run resumed after a restart)."""
        if self._held.get(lease.session_id) != lease or token <= lease.token:
            return lease
        raised = Lease(lease.session_id, lease.holder, token)
        self._held[lease.session_id] = raised
        return raised

    async def release(self, lease: Lease) -> None:
        if self._held.get(lease.session_id) == lease:
            del self._held[lease.session_id]

    async def holder(self, session_id: str) -> str | None:
        lease = self._held.get(session_id)
        return None if lease is None else lease.holder

    async def holders(self, session_ids: Sequence[str]) -> list[str | None]:
        return [await self.holder(session_id) for session_id in session_ids]

    @property
    def held(self) -> int:
        """Locks currently held."""
        return len(self._held)


class LocalRouter:
    """Every run is held by this worker: commands go straight to its handler."""

    def __init__(self) -> None:
        self._handler: CommandHandler | None = None
        self._runs: dict[str, str] = {}

    def bind(self, handler: CommandHandler) -> None:
        self._handler = handler

    async def register(self, run_id: str, session_id: str) -> None:
        self._runs[run_id] = session_id

    async def unregister(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    async def cancel(self, run_id: str, reason: str) -> bool:
        if self._handler is None:
            return False
        return self._handler.cancel_local(run_id, reason)

    async def deliver_external(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        if self._handler is None:
            return None
        return self._handler.deliver_local(session_id, run_id, event)

    @property
    def registered(self) -> int:
        """Runs registered as held here."""
        return len(self._runs)


class LocalValues:
    """``SharedValues`` in a dict; expired entries go at the next write past a threshold."""

    _SWEEP_AT = 1024

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, float]] = {}
        self._sweep_at = self._SWEEP_AT

    def _live(self, key: str) -> str | None:
        found = self._values.get(key)
        if found is None:
            return None
        if found[1] <= time.monotonic():
            del self._values[key]
            return None
        return found[0]

    def _set(self, key: str, value: str, ttl: float) -> None:
        self._values[key] = (value, time.monotonic() + ttl)
        if len(self._values) >= self._sweep_at:
            moment = time.monotonic()
            self._values = {k: v for k, v in self._values.items() if v[1] > moment}
            # amortized: the next sweep waits until the table doubled from what is left
            self._sweep_at = max(self._SWEEP_AT, 2 * len(self._values))

    async def put_new(self, key: str, value: str, ttl: float) -> str | None:
        there = self._live(key)
        if there is not None:
            return there
        self._set(key, value, ttl)
        return None

    async def get(self, key: str) -> str | None:
        return self._live(key)

    async def replace(self, key: str, old: str, new: str, ttl: float) -> bool:
        if self._live(key) != old:
            return False
        self._set(key, new, ttl)
        return True

    async def delete(self, key: str, value: str) -> bool:
        if self._live(key) != value:
            return False
        del self._values[key]
        return True

    async def set(self, key: str, value: str, ttl: float) -> None:
        self._set(key, value, ttl)

    @property
    def count(self) -> int:
        """Entries held, expired ones not yet swept included."""
        return len(self._values)


class LocalBus:
    """The in-process bus of one worker."""

    shared = False

    def __init__(self, *, event_log_ttl: float = 600.0, max_events: int = 100_000) -> None:
        self._events = LocalEventLog(ttl=event_log_ttl, max_events=max_events)
        self._locks = LocalSessionLocks()
        self._router = LocalRouter()
        self._values = LocalValues()
        # runs waiting for a session's lock (``multitask_strategy: enqueue``)
        self.queues = LocalSessionQueue()

    @property
    def events(self) -> LocalEventLog:
        return self._events

    @property
    def locks(self) -> LocalSessionLocks:
        return self._locks

    @property
    def router(self) -> LocalRouter:
        return self._router

    @property
    def values(self) -> LocalValues:
        return self._values

    async def open_run(self, run_id: str, *, session_id: str, fence: int) -> None:
        """The run's log, then its route (``app.bus.base.Bus.open_run``)."""
        await self.events.create(run_id, session_id=session_id, fence=fence)
        await self.router.register(run_id, session_id)

    async def claim_run(self, run_id: str, *, session_id: str, ttl: float) -> Lease | None:
        """The session's lease, then the run's log and route (``app.bus.base.Bus.claim_run``)."""
        lease = await self._locks.acquire(session_id, run_id, ttl)
        if lease is not None:
            await self.open_run(run_id, session_id=session_id, fence=lease.token)
        return lease

    def stats(self) -> dict[str, int]:
        return {
            "event_logs": self._events.logs,
            "live_event_logs": self._events.live_logs,
            "subscribers": self._events.subscribers,
            "locks": self._locks.held,
            "routed_runs": self._router.registered,
        }

    async def ping(self) -> None:
        """The in-process state always answers."""

    async def aclose(self) -> None:
        self._events.close()
