"""Per-run event logs as Redis streams, and one follower per worker that waits for them.

A run's log is a stream (``log:<run>``) whose entry ids are ``<seq>-0``, next to a meta hash
(``meta:<run>``: session, fence, last seq, sealed). Appends go through one script that checks
the fence and the seq and trims the stream (``MAXLEN ~``); the terminal event seals the log
and gives both keys the log TTL. Until then they carry a longer "live" TTL that the writer's
lease renewal extends, so the log of a run whose every worker vanished still goes away.
Appends are pipelined per run, in batches (``app.bus.redis.writer``).

Reading: a subscription reads what is there after its cursor (``XRANGE (cursor``, with the
meta hash, in one script), then waits on the worker's follower (``app.bus.redis.follower``: one
``XREAD BLOCK`` for every subscription of the worker; the runs written here are fed from
memory as Redis confirms them).

While Redis is unreachable a subscription keeps retrying (its ``interrupt`` still returns at
once, so an SSE response keeps sending pings and noticing a gone client) for
``outage_grace`` seconds, then raises ``BusUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus.base import (
    BusError,
    BusUnavailable,
    DirectOffers,
    LeaseLost,
    LogNotFound,
    WireEvent,
)
from app.bus.redis import scripts
from app.bus.redis.connection import Keys, text, unavailable
from app.bus.redis.dedicated import DedicatedScript
from app.bus.redis.follower import MAX_CURSOR, READ_COUNT, Follower, Waiter, decode_entry
from app.bus.redis.locks import milliseconds
from app.bus.redis.writer import AppendPipeline, Batch

__all__ = ["RedisEventLog", "RedisSubscription"]

logger = logging.getLogger("app.bus.redis")

_EMPTY: tuple[WireEvent, ...] = ()
_RETRY_MAX: Final = 2.0


_RS: Final = "\x1e"
"""Ends each field of an append's header (``scripts.APPEND``)."""
_US: Final = "\x1f"
"""Separates the items of a list in an append's header (types, frame lengths)."""

_INTERRUPTED: Final = object()
"""What ``RedisSubscription._read`` returns when interrupted before the read ended."""


def _pairs(raw: Sequence[bytes]) -> dict[bytes, bytes]:
    return {raw[index]: raw[index + 1] for index in range(0, len(raw) - 1, 2)}


@dataclass(frozen=True, slots=True)
class _ReadState:
    """One read of a log: its events after a cursor, its last seq, whether it is sealed, and
    the cursor it was read from."""

    events: Sequence[WireEvent]
    last: int
    sealed: bool
    cursor: int


def _append_error(run_id: str, batch: Batch, status: int) -> BusError | None:
    """What an append's status says of its batch: None if Redis holds it."""
    if status >= scripts.APPEND_DUPLICATE:
        return None
    if status == scripts.APPEND_NO_LOG:
        return LogNotFound(run_id)
    if status == scripts.APPEND_STALE:
        return LeaseLost(f"stale fencing token for run {run_id!r}: another worker took over")
    if status == scripts.APPEND_SEALED:
        return BusError(f"the log of run {run_id!r} is sealed: its terminal event was sent")
    first, final = batch.events[0].seq, batch.events[-1].seq
    seqs = f"seq {first}" if first == final else f"seqs {first}..{final}"
    return BusError(f"run {run_id!r}: event {seqs} does not follow the log's last")


class RedisSubscription(DirectOffers):
    """One reader of one run's log, from its own cursor (see ``app.bus.base.Subscription``)."""

    __slots__ = (
        "_closed",
        "_finished",
        "_interrupted",
        "_log",
        "_need_read",
        "_outage_since",
        "_pause",
        "_prefetched",
        "_reading",
        "_run_id",
        "_waiter",
    )

    def __init__(self, log: RedisEventLog, run_id: str, after: int, prefetched: _ReadState) -> None:
        self._log = log
        self._run_id = run_id
        super().__init__(after)
        self._prefetched: _ReadState | None = prefetched
        self._need_read = True
        self._finished = False
        self._interrupted = False
        self._closed = False
        self._waiter: Waiter | None = None
        self._pause: asyncio.Future[None] | None = None
        self._outage_since: float | None = None
        # a read of the log still going on when ``next`` returned on an interrupt: the next
        # call waits for the same read (its cursor has not moved meanwhile)
        self._reading: asyncio.Future[_ReadState | None] | None = None

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def finished(self) -> bool:
        return self._finished

    def _take_direct(self, events: Sequence[WireEvent]) -> bool:
        """Offer ``direct`` the events Redis just confirmed, right after the cursor, while
        ``next`` waits for them; True if it took them."""
        if self._interrupted or self._closed or self._finished:
            return False
        return self._offer(events, self._run_id)

    def _take(self, events: Sequence[WireEvent]) -> Sequence[WireEvent]:
        batch = [event for event in events if event.seq > self._cursor]
        if not batch:
            return _EMPTY
        self._cursor = batch[-1].seq
        if batch[-1].terminal:
            self._finished = True
        return batch

    async def next(self) -> Sequence[WireEvent]:
        log = self._log
        while not self._closed and not self._finished:
            if log.closed:
                self._finished = True
                break
            if self._need_read:
                state = self._prefetched
                self._prefetched = None
                if state is None:
                    try:
                        read = await self._read()
                    except BusUnavailable:
                        if not await self._ride_out_outage():
                            return _EMPTY  # interrupted while waiting for Redis
                        continue
                    if read is _INTERRUPTED:  # while a read waits for Redis
                        self._take_interrupt()
                        return _EMPTY
                    state = read if isinstance(read, _ReadState) else None
                    self._outage_since = None
                if state is None:  # the log expired or was deleted under us: nothing will come
                    self._finished = True
                    break
                batch = self._take(state.events)
                if state.sealed and self._cursor >= state.last:
                    self._finished = True
                self._need_read = len(state.events) >= READ_COUNT
                if batch or self._finished:
                    return batch
            if self._take_interrupt():
                self._need_read = True  # the next call looks at the log itself again
                return _EMPTY
            waiter = log.follower.wait(self._run_id, self._cursor)
            if self.direct is not None:
                waiter.take = self._take_direct
            self._waiter = waiter
            try:
                events = await waiter.future
            finally:
                self._waiter = None
                log.follower.discard(waiter)
            batch = self._take(events)
            if batch:
                return batch
            # woken empty-handed: an interrupt, a close, or the follower lost Redis
            self._need_read = True
            if self._take_interrupt():
                return _EMPTY
        return _EMPTY

    def _take_interrupt(self) -> bool:
        interrupted, self._interrupted = self._interrupted, False
        return interrupted

    async def _read(self) -> _ReadState | object | None:
        """The log after the cursor, or ``_INTERRUPTED`` if ``interrupt`` (or ``aclose``) came
        first: a read stuck on an unreachable Redis (up to its call timeout, retries included)
        must not hold back the SSE response's pings, nor its noticing a gone client."""
        reading = self._reading
        if reading is None:
            reading = asyncio.ensure_future(self._log.read(self._run_id, self._cursor))
            if reading.done():  # pragma: no cover - a read always suspends at least once
                return reading.result()
            self._reading = reading
        if not reading.done():
            if self._interrupted or self._closed:
                return _INTERRUPTED
            wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._pause = wake
            try:
                waits: list[asyncio.Future[Any]] = [reading, wake]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._pause = None
            if not reading.done():
                return _INTERRUPTED
        self._reading = None
        return reading.result()

    async def _ride_out_outage(self) -> bool:
        """Wait a little before reading again; False if interrupted, raises past the grace."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        elif now - self._outage_since > self._log.outage_grace:
            raise BusUnavailable(
                f"Redis stayed unreachable for {self._log.outage_grace:.0f} s while following "
                f"the events of run {self._run_id!r}"
            )
        if self._take_interrupt():
            return False
        pause: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pause = pause
        try:
            await asyncio.wait([pause], timeout=min(_RETRY_MAX, 0.2 + (now - self._outage_since)))
        finally:
            self._pause = None
        return not self._take_interrupt()

    def interrupt(self) -> None:
        self._interrupted = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            waiter.release()
        pause = self._pause
        if pause is not None and not pause.done():
            pause.set_result(None)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._log.subscription_closed()
            self._wake()
            reading, self._reading = self._reading, None
            if reading is not None:
                reading.cancel()
                await asyncio.wait([reading])
                if not reading.cancelled():
                    reading.exception()  # retrieved: an outage seen by nobody is not an error


class RedisEventLog:
    """Event logs in Redis streams (see the module docstring).

    ``ttl``: seconds a sealed log is kept; ``max_events`` per run (trimmed approximately);
    ``live_ttl``: how long an unsealed log outlives its writer's last lease renewal;
    ``outage_grace``: seconds a subscription rides out an unreachable Redis.
    """

    def __init__(
        self,
        client: Redis,
        follower_client: Redis,
        keys: Keys,
        where: str,
        worker: str,
        *,
        ttl: float,
        max_events: int,
        live_ttl: float,
        outage_grace: float,
    ) -> None:
        self._client = client
        self._keys = keys
        self._where = where
        self._ttl_ms = milliseconds(max(ttl, 0.1))
        self._live_ttl_ms = milliseconds(live_ttl)
        self._max_events = max_events
        self.outage_grace = outage_grace
        self._create: Any = client.register_script(scripts.CREATE)
        self._claim: Any = client.register_script(scripts.CLAIM)
        self._claim_undo: Any = client.register_script(scripts.CLAIM_UNDO)
        # the call on every event's path: a connection of its own, its command's head encoded
        # once (the prefix, the log bound and its TTL never change)
        self._append = DedicatedScript(
            client,
            scripts.APPEND,
            fixed=(keys.prefix, max_events, self._ttl_ms),
            per_call=2,
            name=f"agent-appends:{worker}",
        )
        self._read: Any = client.register_script(scripts.READ)
        self.follower = Follower(follower_client, client, keys, keys.bell(worker))
        self._pipeline = AppendPipeline(self._send, self.follower.confirmed)
        self._writing: dict[str, str] = {}  # run id -> session id, for logs created here
        self._subscribers = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def start(self) -> None:
        self.follower.start()

    async def create(
        self,
        run_id: str,
        *,
        session_id: str,
        fence: int,
        after: int | None = None,
        route: tuple[str, int] | None = None,
    ) -> None:
        """Start the run's log (``EventLog.create``); with ``route`` (worker id, ttl in ms),
        route the run's commands to that worker in the same call (``RedisBus.open_run``)."""
        keys = self._keys
        names = [keys.meta(run_id), keys.live]
        goes_on = "new" if after is None else max(0, after)
        args: list[str | int] = [session_id, fence, self._live_ttl_ms, run_id, goes_on]
        if route is not None:
            names.append(keys.route(run_id))
            args.extend(route)
        async with unavailable(self._where, "creating an event log"):
            created = await self._create(keys=names, args=args)
        if not created:
            raise BusError(f"run {run_id!r} already has an event log")
        self._writing[run_id] = session_id
        self.follower.writing(run_id, 0 if after is None else max(0, after))

    async def claim(
        self, run_id: str, *, session_id: str, lease_ttl_ms: int, route: tuple[str, int]
    ) -> int | None:
        """Take the session's lock for a new run and start its log under that lease's
        token, routed to ``route``'s worker, in one script call (``RedisBus.claim_run``):
        the token, or None (nothing changed) when the session is held by someone else.

        A call that raised (cancelled, or Redis unreachable) may still have run: what it
        took is given back in the background, so the session is not left busy until the
        lease expires."""
        keys = self._keys
        names = [keys.lock(session_id), keys.fence, keys.meta(run_id), keys.live]
        names.append(keys.route(run_id))
        args = [run_id, lease_ttl_ms, session_id, self._live_ttl_ms, *route]
        try:
            async with unavailable(self._where, "taking a session lock"):
                token = await self._claim(keys=names, args=args)
        except BaseException:
            self._background(self._undo_claim(run_id, session_id, route[0]))
            raise
        if token is None:
            return None
        if token == -1:
            raise BusError(f"run {run_id!r} already has an event log")
        self._writing[run_id] = session_id
        self.follower.writing(run_id, 0)
        return int(token)

    async def _undo_claim(self, run_id: str, session_id: str, worker: str) -> None:
        keys = self._keys
        names = [keys.lock(session_id), keys.meta(run_id), keys.log(run_id), keys.live]
        names.append(keys.route(run_id))
        try:
            async with unavailable(self._where, "undoing a session lock"):
                await self._claim_undo(keys=names, args=[run_id, worker])
        except BusError:
            logger.warning(
                "could not give back the lock of a start that failed: it expires with its lease",
                extra={"run_id": run_id, "session_id": session_id},
                exc_info=True,
            )

    async def append(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """Append and wait until Redis holds the event (``app.bus.base.EventLog.append``);
        it goes out with whatever else the run queued meanwhile (``app.bus.redis.writer``)."""
        try:
            await self._pipeline.append(run_id, event, fence=fence)
        finally:
            if event.terminal:  # the run's last append, written or not: its log is done here
                self._writing.pop(run_id, None)

    def append_nowait(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """Queue the event for the run's next batch and return at once; raises the error of
        an earlier batch of the run (then none of the events queued after it were written).
        Readers see it once Redis confirmed it."""
        self._pipeline.append_nowait(run_id, event, fence=fence)

    async def _send(self, batches: Sequence[tuple[str, Batch]]) -> list[BusError | None]:
        """The batches of several runs in one call (``scripts.APPEND``: one header, and every
        frame in one argument); per batch None once Redis holds it, else why not."""
        errors: list[BusError | None] = [None] * len(batches)
        sent: list[int] = []
        header: list[str] = []
        frames: list[bytes] = []
        for index, (run_id, batch) in enumerate(batches):
            events = batch.events
            first = events[0].seq
            if events[-1].seq - first != len(events) - 1:
                # the script numbers a batch's events from its first (the writer queues them
                # in order): a gap is refused here
                errors[index] = _append_error(run_id, batch, scripts.APPEND_SEQ)
                continue
            sent.append(index)
            session_id = ""
            if batch.terminal:  # its lock is released in the same step
                session_id = self._writing.pop(run_id, "")
                if not session_id:  # a log this worker did not start (the reaper's append)
                    session_id = str(events[-1].document["session_id"])
            if len(events) == 1:  # one event a run and call: the common case at one a write
                frame = events[0].frame
                frames.append(frame)
                types, sizes = events[0].type, str(len(frame))
            else:
                batch_frames = [event.frame for event in events]
                frames += batch_frames
                types = _US.join([event.type for event in events])
                sizes = _US.join([str(len(frame)) for frame in batch_frames])
            header += (
                run_id,
                session_id,
                str(batch.fence),
                "1" if batch.terminal else "0",
                str(first),
                types,
                sizes,
            )
        if sent:
            header.append("")  # every field ends with RS
            try:
                async with unavailable(self._where, "appending to an event log"):
                    answer = await self._append(_RS.join(header), b"".join(frames))
            except BaseException:
                for run_id, _ in batches:
                    self.follower.stopped_writing(run_id)
                raise
            for index, status in zip(sent, bytes(answer).split(), strict=True):
                run_id, batch = batches[index]
                errors[index] = _append_error(run_id, batch, int(status))
        for (run_id, _), error in zip(batches, errors, strict=True):
            if error is not None:  # the run goes on elsewhere, or not at all
                self.follower.stopped_writing(run_id)
        return errors

    def released(self, run_id: str) -> None:
        """The run's lease was given back here: this worker no longer writes its log."""
        self.follower.stopped_writing(run_id)

    async def read(self, run_id: str, after: int, *, rebase: bool = False) -> _ReadState | None:
        """The events after ``after`` (at most ``READ_COUNT``); None if there is no log.
        ``rebase``: a new reader, read from the start of a log begun again past its cursor
        (``scripts.READ``; the state's ``cursor`` says from where)."""
        keys = self._keys
        cursor = min(max(0, after), MAX_CURSOR)
        async with unavailable(self._where, "reading an event log"):
            raw = await self._read(
                keys=[keys.meta(run_id), keys.log(run_id)],
                args=[cursor, READ_COUNT, 1 if rebase else 0],
            )
        if not raw or not raw[0]:
            return None
        events = [decode_entry(entry_id, _pairs(fields)) for entry_id, fields in raw[3]]
        return _ReadState(events, int(raw[1]), int(raw[2]) == 1, int(raw[4]))

    async def last_seq(self, run_id: str) -> int | None:
        async with unavailable(self._where, "reading an event log"):
            last = await self._client.hget(self._keys.meta(run_id), "last")
        return None if last is None else int(last)

    async def terminal_seq(self, run_id: str) -> int | None:
        async with unavailable(self._where, "reading an event log"):
            last, sealed = await self._client.hmget(self._keys.meta(run_id), ["last", "sealed"])
        if last is None or sealed is None or text(sealed) != "1":
            return None
        return int(last)

    async def subscribe(self, run_id: str, after: int = 0) -> RedisSubscription:
        state = await self.read(run_id, max(0, after), rebase=True)
        if state is None:
            raise LogNotFound(run_id)
        self._subscribers += 1
        return RedisSubscription(self, run_id, state.cursor, state)

    async def exists(self, run_id: str) -> bool:
        async with unavailable(self._where, "reading an event log"):
            found = await self._client.exists(self._keys.meta(run_id))
        return bool(found)

    def discard(self, run_id: str) -> None:
        """Forget a log at once (a run that never started); the deletion runs in the
        background."""
        self._writing.pop(run_id, None)
        self.follower.stopped_writing(run_id)
        self._pipeline.discard(run_id)
        self._background(self._delete(run_id))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete(self, run_id: str) -> None:
        keys = self._keys
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(keys.meta(run_id), keys.log(run_id))
                pipe.zrem(keys.live, run_id)
                await pipe.execute()
        except (RedisError, OSError):
            logger.warning("could not delete the event log of run %s", run_id, exc_info=True)

    async def orphans(self, limit: int = 500) -> list[tuple[str, str]]:
        """Unsealed logs whose run has no route left (no worker renews its lease), oldest
        first: ``(run_id, session_id)``. Logs that expired are dropped from the index."""
        keys = self._keys
        async with unavailable(self._where, "listing unsealed event logs"):
            members = await self._client.zrange(keys.live, 0, limit - 1)
            if not members:
                return []
            runs = [text(member) for member in members]
            async with self._client.pipeline(transaction=False) as pipe:
                for run_id in runs:
                    pipe.hget(keys.meta(run_id), "session")
                    pipe.exists(keys.route(run_id))
                answers = await pipe.execute()
            found: list[tuple[str, str]] = []
            gone: list[str] = []
            for index, run_id in enumerate(runs):
                session, routed = answers[2 * index], answers[2 * index + 1]
                if session is None:
                    gone.append(run_id)
                elif not routed:
                    found.append((run_id, text(session)))
            if gone:
                await self._client.zrem(keys.live, *gone)
        return found

    def subscription_closed(self) -> None:
        self._subscribers -= 1

    @property
    def subscribers(self) -> int:
        """Open subscriptions on this worker."""
        return self._subscribers

    @property
    def live_logs(self) -> int:
        """Logs this worker created and has not sealed yet."""
        return len(self._writing)

    async def aclose(self) -> None:
        self.closed = True
        await self._pipeline.aclose()
        await self._append.aclose()
        await self.follower.aclose()
        if self._tasks:
            await asyncio.wait(self._tasks)
