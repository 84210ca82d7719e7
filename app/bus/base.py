"""What workers share: each run's event log, the session locks, and command routing.

Three Protocols, implemented in-process by ``app.bus.local`` (one worker) and across workers
by a Redis implementation (streams for the logs, leases for the locks, pub/sub for commands)::

    Bus
     ├── events: EventLog      per-run append-only log: create, append, subscribe from a cursor
     │                          (replay, then follow), sealed by the terminal event, kept TTL
     ├── locks: SessionLocks    one active run per session: a renewable lease carrying a
     │                          fencing token that only grows
     ├── router: Router         cancel a run / deliver an external answer on whichever worker
     │                          holds it, with that worker's reply
     └── values: SharedValues   small values with a TTL that every worker sees (idempotency
                                keys, re-attach counters, the stream tokens' secret)

Only the worker that holds a run's lease appends to its log, so ``seq`` is assigned by that
writer: 1 for the first event, +1 for each next one. The writer passes its lease's fencing
token with every append. A log accepts a token at least as high as the highest it has seen
and refuses a lower one: when a worker's lease lapses, whoever declares its runs lost takes
the session's lock (a higher token), appends the terminal ``run.failed`` (``worker_lost``)
with it, and the lost worker, should it come back, can no longer write.

Errors::

    BusError
     ├── LogNotFound    the log does not exist (never created, or expired)
     ├── LeaseLost      an append or renewal with a lease that is no longer held
     └── BusUnavailable the shared bus (Redis) cannot be reached or did not answer in time
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent_runtime.extensions.external import ExternalEvent

__all__ = [
    "TERMINAL_TYPES",
    "AppendNowait",
    "Bus",
    "BusError",
    "BusUnavailable",
    "CommandHandler",
    "DirectOffers",
    "DirectReader",
    "EventLog",
    "Lease",
    "LeaseLost",
    "LogNotFound",
    "Router",
    "SessionLocks",
    "SharedValues",
    "Subscription",
    "WireEvent",
]

logger = logging.getLogger("app.bus")

TERMINAL_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})


class BusError(Exception):
    """Base of the bus's errors."""


class LogNotFound(BusError):
    """No log for this run: it never existed here, or it expired."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no event log for run {run_id!r} (unknown or expired)")
        self.run_id = run_id


class LeaseLost(BusError):
    """The lease is no longer held by its bearer (expired, or taken over)."""


class BusUnavailable(BusError):
    """The shared bus (Redis) cannot be reached, or did not answer in time."""


@dataclass(frozen=True, slots=True)
class WireEvent:
    """One event as it goes on the wire: its ``seq``, SSE ``type`` and the encoded SSE frame.

    ``frame`` is the complete frame (``id:``, ``event:``, ``data:`` lines and the blank line),
    encoded once when the event is created; subscribers send it as is.
    """

    seq: int
    type: str
    frame: bytes

    @property
    def terminal(self) -> bool:
        """True for run.completed, run.failed and run.cancelled."""
        return self.type in TERMINAL_TYPES

    @property
    def document(self) -> dict[str, Any]:
        """The decoded ``data:`` JSON object (for tests and tools, not the hot path)."""
        for line in self.frame.decode("utf-8").split("\n"):
            if line.startswith("data: "):
                value = json.loads(line[6:])
                assert isinstance(value, dict)
                return value
        raise ValueError("frame without a data line")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class Lease:
    """A held session lock. ``token`` is the fencing token: it grows with every acquisition."""

    session_id: str
    holder: str
    token: int


DirectReader = Callable[[Sequence[WireEvent]], bool]
"""A reader's synchronous taker of the events after its cursor (see ``Subscription``): True
when it took them all, False to have them from ``next`` as usual. It must not block."""


class DirectOffers:
    """A log's subscription's cursor and ``direct`` reader, and what it does with the events
    offered to that reader (the base of the logs' subscriptions)."""

    __slots__ = ("_cursor", "direct")

    def __init__(self, cursor: int) -> None:
        self._cursor = cursor
        self.direct: DirectReader | None = None

    def _offer(self, events: Sequence[WireEvent], run_id: str) -> bool:
        """``direct(events)``; the cursor moves past the events it took. A reader that raised
        is dropped (logged) and the events go to ``next``: a reader's mistake must not fail
        the append that offered them."""
        direct = self.direct
        if direct is None:
            return False
        try:
            taken = direct(events)
        except Exception:
            logger.exception("a direct reader of run %s failed", run_id)
            self.direct = None
            return False
        if taken:
            self._cursor = events[-1].seq
        return taken


class AppendNowait(Protocol):
    """An event log's append that does not wait (``append_nowait``, where a log has one)."""

    def __call__(self, run_id: str, event: WireEvent, *, fence: int) -> None: ...


class Subscription(Protocol):
    """One reader of one run's log, from its own cursor. Close it (``aclose``) when done.

    A subscription may also offer a ``direct`` attribute (a ``DirectReader`` or None), which
    an event stream sets: while ``next`` waits, the events the log takes from then on are
    first offered to it, in the appending task (on Redis, once confirmed); those it takes
    advance the cursor and ``next`` goes on waiting. A reader that writes each event to its
    client synchronously spares a task wake-up per event.
    """

    @property
    def cursor(self) -> int:
        """The seq of the last event returned (0 before the first)."""
        ...

    @property
    def finished(self) -> bool:
        """True once the terminal event was returned: nothing more will come."""
        ...

    async def next(self) -> Sequence[WireEvent]:
        """The events after the cursor, waiting until there is at least one.

        Returns an empty sequence when ``interrupt`` was called while it waited, or when the
        log is finished and everything was returned.
        """
        ...

    def interrupt(self) -> None:
        """Wake a pending ``next`` (it returns empty). Safe to call at any time."""
        ...

    async def aclose(self) -> None:
        """Stop reading; idempotent."""
        ...


class EventLog(Protocol):
    """Per-run, append-only, bounded event logs.

    A log may also offer ``append_nowait(run_id, event, *, fence)``, which the run's driver
    uses when it is there: the in-process log appends at once; the Redis log queues the event
    for the run's next batch (``app.bus.redis.writer``) and raises a failed batch's error at
    the run's next append. Either way a reader sees an event only once the log holds it.
    """

    async def create(
        self, run_id: str, *, session_id: str, fence: int, after: int | None = None
    ) -> None:
        """Start an empty log for a run, writable with the lease token ``fence``. ``after``
        (None for a new run) begins the log again after that seq: a run resumed from its
        checkpoint once its log was lost (a restarted process or Redis) keeps its seq rising,
        and a new reader whose cursor is past ``after`` reads such a log from its start."""
        ...

    async def append(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """Append the next event (``seq`` = previous + 1).

        A terminal event seals the log; it is kept for the configured TTL, then expires.
        Raises ``LogNotFound``, or ``LeaseLost`` for a ``fence`` lower than one already used.
        """
        ...

    async def last_seq(self, run_id: str) -> int | None:
        """The seq of the log's last event (0 if empty); None if there is no such log."""
        ...

    async def terminal_seq(self, run_id: str) -> int | None:
        """The seq of the run's terminal event once the log is sealed; None before (or
        without a log)."""
        ...

    async def subscribe(self, run_id: str, after: int = 0) -> Subscription:
        """A reader that replays the events with ``seq > after`` and then follows live.

        Raises ``LogNotFound``.
        """
        ...

    async def exists(self, run_id: str) -> bool:
        """Whether the run's log is available."""
        ...


class SessionLocks(Protocol):
    """One active run per session, as renewable leases with fencing tokens."""

    async def acquire(
        self, session_id: str, holder: str, ttl: float, *, exclusive: bool = False
    ) -> Lease | None:
        """Take the session's lock for ``holder`` (a run id) for ``ttl`` seconds.

        None if another holder has it. A shared bus answers a call for the holder that has
        the lock already with that lease (a call retried after its answer was lost);
        ``exclusive`` answers None then too: a holder several workers may name (a run
        resumed from its checkpoint) must not take over a lease another worker holds.
        """
        ...

    async def renew(self, lease: Lease, ttl: float) -> None:
        """Extend a held lease by ``ttl`` seconds from now; raises ``LeaseLost``."""
        ...

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[bool]:
        """Extend each held lease by ``ttl`` seconds from now, on a shared bus in one call:
        per lease True, or False for one that is no longer held (``renew``'s ``LeaseLost``).
        Raises when the call as a whole failed (``BusUnavailable``): none is confirmed."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lock back if this lease still holds it; idempotent."""
        ...

    async def holder(self, session_id: str) -> str | None:
        """The current holder of the session's lock, or None."""
        ...

    async def holders(self, session_ids: Sequence[str]) -> list[str | None]:
        """The current holder of each session's lock (or None), in order; one round trip."""
        ...


class CommandHandler(Protocol):
    """What a worker does with commands addressed to runs it holds (the run manager)."""

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held by this worker; False if it holds no such unfinished run."""
        ...

    def deliver_local(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        """Offer an external answer to this worker's agent; the names that accepted it, ``[]``
        if the run is held here and took nothing, None if this worker cannot speak for it."""
        ...


class Router(Protocol):
    """Routes commands to the worker holding a run, and brings its answer back."""

    def bind(self, handler: CommandHandler) -> None:
        """Set this worker's handler (once, before serving)."""
        ...

    async def register(self, run_id: str, session_id: str) -> None:
        """This worker now holds the run."""
        ...

    async def unregister(self, run_id: str) -> None:
        """This worker no longer holds the run."""
        ...

    async def cancel(self, run_id: str, reason: str) -> bool:
        """Cancel the run wherever it runs; False if no worker holds it unfinished."""
        ...

    async def deliver_external(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        """Deliver an answer to whichever worker accepts it; the accepting extensions' names,
        ``[]`` if the run's worker took nothing, None if no worker could speak for the run
        (none holds it, its worker is gone or silent, or between owners)."""
        ...


class SharedValues(Protocol):
    """Small string values under names, each with a TTL, seen by every worker."""

    async def put_new(self, key: str, value: str, ttl: float) -> str | None:
        """Store ``value`` unless ``key`` holds one: None if stored, else the value there."""
        ...

    async def get(self, key: str) -> str | None:
        """The value under ``key``, None if there is none (or it expired)."""
        ...

    async def set(self, key: str, value: str, ttl: float) -> None:
        """Store ``value`` under ``key`` for ``ttl`` seconds, whatever was there."""
        ...

    async def replace(self, key: str, old: str, new: str, ttl: float) -> bool:
        """Set ``new`` (with a new TTL) if ``key`` still holds ``old``; whether it did."""
        ...

    async def delete(self, key: str, value: str) -> bool:
        """Remove ``key`` if it still holds ``value``; whether it did."""
        ...


class Bus(Protocol):
    """The shared services of one worker, and their lifetime."""

    @property
    def events(self) -> EventLog: ...

    @property
    def locks(self) -> SessionLocks: ...

    @property
    def router(self) -> Router: ...

    @property
    def values(self) -> SharedValues: ...

    @property
    def shared(self) -> bool:
        """True when other worker processes see the same state (Redis)."""
        ...

    async def open_run(self, run_id: str, *, session_id: str, fence: int) -> None:
        """Start a new run's log (``EventLog.create``) and route its commands to this worker
        (``Router.register``): on a shared bus in one round trip, both or neither."""
        ...

    async def claim_run(self, run_id: str, *, session_id: str, ttl: float) -> Lease | None:
        """Take the session's lease for a new run (``SessionLocks.acquire``, ``run_id`` the
        holder) and open the run under it (``open_run``, the lease's token as the fence): on
        a shared bus in one round trip. None, with nothing opened, when the session is held."""
        ...

    def stats(self) -> dict[str, int]:
        """Counts for leak checks: logs, subscribers, locks, routed runs."""
        ...

    async def ping(self) -> None:
        """Return once the shared state answers; raise ``BusError`` if it does not."""
        ...

    async def aclose(self) -> None:
        """Release connections and timers; idempotent."""
        ...
