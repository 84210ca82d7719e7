"""Coalesced appends: every run's events go to Redis in batches, and the batches of all the
runs this worker writes go out together, one script call at a time.

A run's writer queues its events (``append_nowait``) and returns at once. One task per worker
sends them: each call carries, for every run with queued events, the batch of its events
queued so far (``scripts.APPEND``: per run one fence and one seq check for its whole batch, all
or none). A batch holds consecutive events with one fence (a different fence starts the next
batch) and ends at a terminal event. An awaited ``append`` joins the same queue and returns
once its batch is confirmed, so the calls of one run are written in the order they came.

The window. A call begins at most once per ``window`` seconds (10 ms): the first event after
a quiet spell goes out at once, and while events keep coming, those of the next ``window``
wait for the same call. One call then carries many runs' events, which is what makes the
shared bus cheap per event: a call costs the worker far more than the events in it (encoding,
the pool, the round trip's system calls, and above all waking Redis, which on a virtual machine
costs a few hundred µs; docs/benchmarks.md). The price is at most ``window`` of added latency
while the worker is busy: less than a frame of a screen, and less than a streaming model's gap
between two tokens (20 ms and more), so a token still reaches its reader as its own write.

What readers see. An event reaches *any* reader, on this worker or another, only once Redis
confirmed its batch: readers on this worker are fed from memory the moment the answer comes
(without waiting for the follower's next ``XREAD``), readers elsewhere through Redis. So "a
reader never sees an event the log does not hold" holds for every reader, and a terminal
event is durable before any stream reports it. A worker that dies inside the window loses
only events no reader saw: the run resumes from its checkpoint, whose seq is at or before the
log's last. Feeding local readers before the answer would save the window and one round trip
of latency, but a refused batch (a stale fence: another worker took the run over and wrote
its end at that same seq) would then have shown events that no log holds and that a resumed
stream contradicts.

When a batch fails (refused, or Redis unreachable) none of its events is in the log and
every later event of its run would leave a gap: the queued events of fire-and-forget appends
are dropped, the error is kept, and the run's next append (either kind) raises it. Its end
(the finalizer's awaited terminal append) meets the error too, and the run is failed the way a
failed unpipelined append fails it. A call that fails as a whole (Redis unreachable) fails
the batch of every run in it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from app.bus.base import BusError, WireEvent

__all__ = ["MAX_BATCH", "MAX_CALL", "WINDOW", "AppendPipeline", "Batch"]

MAX_BATCH: Final = 1_000
"""Events of one run per script call at most: a longer backlog goes out in several calls."""

MAX_CALL: Final = 4_000
"""Events per script call at most, all runs together: the rest waits for the next call."""

WINDOW: Final = 0.010
"""Seconds between the starts of two calls at least (see the module docstring)."""


class Batch:
    """Consecutive events of one run with one fence, sent in one call."""

    __slots__ = ("events", "fence", "waiters")

    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.events: list[WireEvent] = []
        self.waiters: list[asyncio.Future[None]] = []

    @property
    def terminal(self) -> bool:
        return bool(self.events) and self.events[-1].terminal


_Item = tuple[WireEvent, int, "asyncio.Future[None] | None"]
"""A queued event, its fence, and the future of the ``append`` that waits for it (if any)."""


class _RunQueue:
    __slots__ = ("failure", "items", "sending")

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self.sending = False  # a batch of the run is in the call in flight
        self.failure: BusError | None = None


Send = Callable[[Sequence[tuple[str, Batch]]], Awaitable[Sequence[BusError | None]]]
"""Writes the batches of several runs in one call; per batch None once confirmed, else the
error. Raises ``BusError`` when the call as a whole failed (then none was written)."""


class AppendPipeline:
    """The queues of the runs this worker writes, and their one sender (see the module
    docstring)."""

    def __init__(
        self,
        send: Send,
        confirmed: Callable[[str, Sequence[WireEvent]], None],
        *,
        window: float = WINDOW,
    ) -> None:
        self._send = send
        self._confirmed = confirmed
        self._window = window
        self._runs: dict[str, _RunQueue] = {}
        # runs with queued events, in the order they queued them (insertion-ordered)
        self._ready: dict[str, _RunQueue] = {}
        self._task: asyncio.Task[None] | None = None
        self._last_call = -float("inf")

    def append_nowait(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """Queue the event; raises the error of an earlier batch of the run."""
        self._queue(run_id, event, fence, None)

    async def append(self, run_id: str, event: WireEvent, *, fence: int) -> None:
        """Queue the event and wait for its batch; raises its error (or an earlier one)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue(run_id, event, fence, waiter)
        await waiter

    def _queue(
        self, run_id: str, event: WireEvent, fence: int, waiter: asyncio.Future[None] | None
    ) -> None:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _RunQueue()
        failure = run.failure
        if failure is not None:
            if event.terminal:  # the run's last call: nothing more to report after it
                self._forget(run_id, run)
            raise failure
        run.items.append((event, fence, waiter))
        if not run.sending:
            self._ready[run_id] = run
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._sender(), name="redis-appends"
            )

    def _forget(self, run_id: str, run: _RunQueue) -> None:
        if self._runs.get(run_id) is run and not run.sending and not run.items:
            del self._runs[run_id]

    @staticmethod
    def _take(run: _RunQueue, room: int) -> Batch:
        items = run.items
        fence = items[0][1]
        batch = Batch(fence)
        events, waiters = batch.events, batch.waiters
        limit = min(MAX_BATCH, room, len(items))
        count = 0
        while count < limit:
            event, item_fence, waiter = items[count]
            if item_fence != fence:
                break
            count += 1
            events.append(event)
            if waiter is not None:
                waiters.append(waiter)
            if event.terminal:
                break
        del items[:count]
        return batch

    def _collect(self) -> list[tuple[str, _RunQueue, Batch]]:
        """One batch of each ready run, up to ``MAX_CALL`` events in all."""
        taken: list[tuple[str, _RunQueue, Batch]] = []
        room = MAX_CALL
        ready = self._ready
        while ready and room > 0:
            run_id, run = next(iter(ready.items()))
            del ready[run_id]
            batch = self._take(run, room)
            room -= len(batch.events)
            run.sending = True
            taken.append((run_id, run, batch))
        return taken

    async def _sender(self) -> None:
        taken: list[tuple[str, _RunQueue, Batch]] = []
        try:
            while self._ready:
                wait = self._last_call + self._window - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # more events join this call meanwhile
                self._last_call = time.monotonic()
                taken = self._collect()
                try:
                    errors: Sequence[BusError | None] = await self._send(
                        [(run_id, batch) for run_id, _, batch in taken]
                    )
                except BusError as exc:
                    errors = [exc] * len(taken)
                for (run_id, run, batch), error in zip(taken, errors, strict=True):
                    self._settle(run_id, run, batch, error)
                taken = []
        except BaseException:  # cancelled, or a bug: no caller may wait forever
            for run_id, run, batch in taken:
                run.sending = False
                self._fail_all(run, batch, BusError(f"run {run_id!r}: the append stopped"))
            for run_id, run in list(self._ready.items()):
                self._fail_all(run, None, BusError(f"run {run_id!r}: the append stopped"))
            self._ready.clear()
            raise
        finally:
            self._task = None

    def _settle(self, run_id: str, run: _RunQueue, batch: Batch, error: BusError | None) -> None:
        run.sending = False
        if error is None:
            self._confirmed(run_id, batch.events)
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        else:
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
            if len(batch.waiters) < len(batch.events):  # fire-and-forget events in it
                # a gap follows: every later event is refused; the run hears it next call
                run.failure = error
                self._fail_all(run, None, error)
        if run.items:
            if self._runs.get(run_id) is run:
                self._ready[run_id] = run
            else:  # discarded meanwhile
                self._fail_all(run, None, BusError(f"run {run_id!r} was discarded"))
        elif run.failure is None:
            self._forget(run_id, run)

    @staticmethod
    def _fail_all(run: _RunQueue, batch: Batch | None, error: BusError) -> None:
        waiters = list(batch.waiters) if batch is not None else []
        waiters.extend(waiter for _, _, waiter in run.items if waiter is not None)
        run.items.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)

    def discard(self, run_id: str) -> None:
        """Drop what the run queued (a start undone); a call in flight still ends."""
        run = self._runs.pop(run_id, None)
        self._ready.pop(run_id, None)
        if run is not None:
            self._fail_all(run, None, BusError(f"run {run_id!r} was discarded"))

    @property
    def writing(self) -> int:
        """Runs with queued events, or an error not yet reported."""
        return len(self._runs)

    async def aclose(self) -> None:
        """Wait until what is queued is sent (each call bounded by the bus's call timeout)."""
        task = self._task
        if task is not None:
            await asyncio.wait([task])
