"""The worker's follower of the event logs its subscriptions wait on.

One task and one connection per worker: a single ``XREAD BLOCK`` over every stream some
subscription waits on, from the lowest cursor each, plus the worker's "bell" stream. The runs
this worker writes are left out of it: their readers here are fed from memory as Redis confirms
each batch (``Follower.confirmed``), and a reader that is behind what was confirmed reads the
log again instead of waiting; once the run is no longer written here (its end, a refused batch,
its lease given back), its readers are followed through ``XREAD`` like any other's. A
subscription that needs a stream (or an older cursor) the pending ``XREAD`` does not cover
rings the bell (``XADD``), which ends that ``XREAD`` at once, so the next one covers it.
Because ``XREAD`` resumes from explicit ids, nothing appended in between is missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.bus.base import DirectReader, WireEvent
from app.bus.redis.connection import BLOCK_MS, Keys
from app.tasks import stop_task, stop_tasks

__all__ = ["MAX_CURSOR", "READ_COUNT", "Follower", "Waiter", "decode_entry"]

logger = logging.getLogger("app.bus.redis")

READ_COUNT: Final = 1_000
"""Events per read: a long replay comes in batches of this many."""
MAX_CURSOR: Final = 2**53
"""Above any seq: a cursor is clamped to it."""
_EMPTY: tuple[WireEvent, ...] = ()
_BELL_TTL_MS: Final = 3_600_000
_RETRY_FIRST: Final = 0.1
_RETRY_MAX: Final = 2.0


def decode_entry(entry_id: bytes, fields: Mapping[bytes, bytes]) -> WireEvent:
    """The wire event of a log entry (``<seq>-0``, its type and frame)."""
    seq = int(bytes(entry_id).split(b"-", 1)[0])
    return WireEvent(seq, bytes(fields[b"t"]).decode(), bytes(fields[b"f"]))


class Waiter:
    """One subscription waiting for the events after its cursor."""

    __slots__ = ("cursor", "future", "run_id", "take")

    def __init__(self, run_id: str, cursor: int) -> None:
        self.run_id = run_id
        self.cursor = cursor
        self.future: asyncio.Future[Sequence[WireEvent]] = (
            asyncio.get_running_loop().create_future()
        )
        # its subscription's direct reader: events it takes leave the waiter waiting
        self.take: DirectReader | None = None

    def release(self, events: Sequence[WireEvent] = _EMPTY) -> None:
        if not self.future.done():
            self.future.set_result(events)


class Follower:
    """One ``XREAD BLOCK`` for every subscription of this worker (see the module docstring)."""

    def __init__(self, client: Redis, bell_client: Redis, keys: Keys, bell: str) -> None:
        self._client = client  # one connection, used by this task only
        self._bell_client = bell_client
        self._keys = keys
        self._bell = bell
        self._bell_id: bytes | None = None
        self._waiters: dict[str, set[Waiter]] = {}
        # the runs this worker writes: the last seq Redis confirmed of each
        self._local: dict[str, int] = {}
        self._issued: dict[str, int] = {}
        self._reading = False
        self._ringing = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rings: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="redis-follower")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        await stop_tasks(list(self._rings))
        self.release_all()
        await self._client.aclose()

    def wait(self, run_id: str, cursor: int) -> Waiter:
        """A waiter released with the events after ``cursor`` as soon as there are some (or
        empty-handed, to read the log again)."""
        waiter = Waiter(run_id, cursor)
        confirmed = self._local.get(run_id)
        if confirmed is not None:
            if confirmed > cursor:
                waiter.release()  # behind what Redis holds: read it there
            else:
                # fed by ``confirmed``; the follower's XREAD (of its bell alone, if need be)
                # still runs, so that an outage reaches this reader as it reaches the others
                self._waiters.setdefault(run_id, set()).add(waiter)
                self._wake.set()
            return waiter
        self._waiters.setdefault(run_id, set()).add(waiter)
        self._wake.set()
        if self._reading:
            issued = self._issued.get(run_id)
            if issued is None or cursor < issued:
                self._ring()
        return waiter

    def discard(self, waiter: Waiter) -> None:
        waiters = self._waiters.get(waiter.run_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[waiter.run_id]

    def writing(self, run_id: str, seq: int) -> None:
        """This worker writes the run's log from ``seq`` on: its readers here are fed by
        ``confirmed``, not by ``XREAD``."""
        self._local[run_id] = seq

    def stopped_writing(self, run_id: str) -> None:
        """This worker no longer writes the run's log: its readers here wait on ``XREAD``."""
        if self._local.pop(run_id, None) is not None and run_id in self._waiters:
            self._wake.set()
            if self._reading:
                self._ring()

    def confirmed(self, run_id: str, events: Sequence[WireEvent]) -> None:
        """Feed this worker's readers of the run the events Redis just confirmed it holds
        (appended here), without waiting for the next ``XREAD`` to bring them. A reader whose
        cursor is further back than the first of them reads the log again (no gap)."""
        if not events:
            return
        final = events[-1].seq
        local = run_id in self._local
        if local:
            self._local[run_id] = final
        group = self._waiters.get(run_id)
        if group:
            first = events[0].seq
            for waiter in list(group):
                cursor = waiter.cursor
                if cursor == first - 1:  # the usual reader: right behind the batch
                    take = waiter.take
                    if take is not None and not waiter.future.done() and take(events):
                        waiter.cursor = final  # written already: it waits for the next
                        continue
                    group.discard(waiter)
                    waiter.release(events)
                elif first <= cursor < final:
                    group.discard(waiter)
                    waiter.release([event for event in events if event.seq > cursor])
                elif local and cursor < first - 1:
                    group.discard(waiter)
                    waiter.release()
            if not group:
                self._waiters.pop(run_id, None)
        if local and events[-1].terminal:
            self._local.pop(run_id, None)

    def release_all(self) -> None:
        """Wake every waiter empty-handed (they read again)."""
        waiters, self._waiters = self._waiters, {}
        for group in waiters.values():
            for waiter in group:
                waiter.release()

    @property
    def waiting(self) -> int:
        return sum(len(group) for group in self._waiters.values())

    def _ring(self) -> None:
        if self._ringing:
            return  # one ring ends the pending XREAD; the next one is computed afresh
        self._ringing = True
        task = asyncio.get_running_loop().create_task(self._ring_bell())
        self._rings.add(task)
        task.add_done_callback(self._rings.discard)

    async def _ring_bell(self) -> None:
        try:
            await self._bell_xadd(self._bell_client)
        except (RedisError, OSError):
            # the follower's own XREAD fails the same way, and its waiters read again
            logger.debug("could not ring the follower's bell", exc_info=True)

    async def _bell_xadd(self, client: Redis) -> bytes:
        async with client.pipeline(transaction=True) as pipe:
            pipe.xadd(self._bell, {b"r": b"1"}, maxlen=1, approximate=False)
            pipe.pexpire(self._bell, _BELL_TTL_MS)
            entry_id, _ = await pipe.execute()
        return bytes(entry_id)

    async def _run(self) -> None:
        delay = _RETRY_FIRST
        failing = False
        while True:
            if not self._waiters:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if self._bell_id is None:
                    # before reading: a ring that came in meanwhile would be older than
                    # this entry, and an XREAD from it would not see that ring
                    self._bell_id = await self._bell_xadd(self._client)
                    continue
                local = self._local
                issued = {
                    run: min(w.cursor for w in group)
                    for run, group in self._waiters.items()
                    if run not in local
                }
                self._issued = issued
                self._ringing = False
                self._reading = True
                streams: dict[Any, Any] = {self._bell: self._bell_id}
                for run_id, cursor in issued.items():
                    streams[self._keys.log(run_id)] = f"{cursor}-0"
                response = await self._client.xread(streams, count=READ_COUNT, block=BLOCK_MS)
            except (RedisError, OSError) as exc:
                self._bell_id = None
                if not failing:
                    logger.warning("Redis unreachable while following event logs: %s", exc)
                failing = True
                self.release_all()  # they read again, and meet the outage themselves
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            finally:
                self._reading = False
            if failing:
                logger.info("Redis reachable again: following event logs")
                failing = False
            delay = _RETRY_FIRST
            try:
                self._dispatch(response, issued)
            except Exception:  # a malformed entry must not stop every reader of this worker
                logger.exception("could not dispatch events read from Redis")
                self.release_all()

    def _dispatch(self, response: Any, issued: Mapping[str, int]) -> None:
        if not response:
            return
        for key, entries in response:  # RESP2: [[stream, [(id, fields), ...]], ...]
            name = bytes(key).decode()
            if not entries:
                continue
            if name == self._bell:
                self._bell_id = bytes(entries[-1][0])
                continue
            run_id = self._keys.run_of_log(name)
            group = self._waiters.get(run_id)
            if not group:
                continue
            # The read started after ``start``: a waiter that joined since with an older
            # cursor would see a gap. It rang the bell and the next read starts at its cursor.
            start = issued.get(run_id, MAX_CURSOR)
            events = [decode_entry(entry_id, fields) for entry_id, fields in entries]
            for waiter in list(group):
                if waiter.cursor < start:
                    continue
                batch = [event for event in events if event.seq > waiter.cursor]
                if batch:
                    group.discard(waiter)
                    waiter.release(batch)
            if not group:
                self._waiters.pop(run_id, None)
