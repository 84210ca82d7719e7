"""Pipelined appends: each run's events go to Redis in batches, one script call per batch,
while the run goes on producing the next ones.

A run's writer queues its events (``append_nowait``) and returns at once. One task per run
with queued events sends them: everything queued while a call is in flight goes out together
in the next call (``scripts.APPEND``: one fence and one seq check for the whole batch, all
or none). A batch holds consecutive events with one fence (a different fence starts the next
batch) and ends at a terminal event. An awaited ``append`` joins the same queue and returns
once its batch is confirmed, so the calls of one run are written in the order they came.

What readers see. An event reaches *any* reader, on this worker or another, only once Redis
confirmed its batch: readers on this worker are fed from memory the moment the answer comes
(without waiting for the follower's next ``XREAD``), readers elsewhere through Redis. So "a
reader never sees an event the log does not hold" holds for every reader, and a terminal
event is durable before any stream reports it. Feeding local readers before the answer would
save one round trip of latency (not of throughput: batches keep the rate), but a refused
batch (a stale fence: another worker took the run over and wrote its end at that same seq)
would then have shown events that no log holds and that a resumed stream contradicts.

When a batch fails (refused, or Redis unreachable) none of its events is in the log and
every later event would leave a gap: the queued events of fire-and-forget appends are
dropped, the error is kept, and the run's next append (either kind) raises it. Its end
(the finalizer's awaited terminal append) meets the error too, and the run is failed the way a
failed unpipelined append fails it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from app.bus.base import BusError, WireEvent

__all__ = ["MAX_BATCH", "AppendPipeline", "Batch"]

MAX_BATCH: Final = 1_000
"""Events per script call at most: a longer backlog goes out in several calls in a row."""


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


class _Item:
    __slots__ = ("event", "fence", "waiter")

    def __init__(self, event: WireEvent, fence: int, waiter: asyncio.Future[None] | None) -> None:
        self.event = event
        self.fence = fence
        self.waiter = waiter


class _RunQueue:
    __slots__ = ("failure", "items", "task")

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self.task: asyncio.Task[None] | None = None
        self.failure: BusError | None = None


Send = Callable[[str, Batch], Awaitable[BusError | None]]
"""Writes one batch; None once confirmed, else the error (raised ``BusError`` included)."""


class AppendPipeline:
    """The queues of the runs this worker writes (see the module docstring)."""

    def __init__(self, send: Send, confirmed: Callable[[str, Sequence[WireEvent]], None]) -> None:
        self._send = send
        self._confirmed = confirmed
        self._runs: dict[str, _RunQueue] = {}

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
        run.items.append(_Item(event, fence, waiter))
        if run.task is None:
            run.task = asyncio.get_running_loop().create_task(
                self._flush(run_id, run), name=f"redis-append:{run_id}"
            )

    def _forget(self, run_id: str, run: _RunQueue) -> None:
        if self._runs.get(run_id) is run and run.task is None and not run.items:
            del self._runs[run_id]

    @staticmethod
    def _take(run: _RunQueue) -> Batch:
        items = run.items
        batch = Batch(items[0].fence)
        while items and len(batch.events) < MAX_BATCH and items[0].fence == batch.fence:
            item = items.popleft()
            batch.events.append(item.event)
            if item.waiter is not None:
                batch.waiters.append(item.waiter)
            if item.event.terminal:
                break
        return batch

    async def _flush(self, run_id: str, run: _RunQueue) -> None:
        try:
            while run.items:
                batch = self._take(run)
                blind = len(batch.waiters) < len(batch.events)  # fire-and-forget events in it
                try:
                    error = await self._send(run_id, batch)
                except BusError as exc:
                    error = exc
                except BaseException:  # cancelled, or a bug: no caller may wait forever
                    self._fail_all(run, batch, BusError(f"run {run_id!r}: the append stopped"))
                    raise
                if error is None:
                    self._confirmed(run_id, batch.events)
                    for waiter in batch.waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                    continue
                for waiter in batch.waiters:
                    if not waiter.done():
                        waiter.set_exception(error)
                if blind:
                    # a gap follows: every later event is refused; the run hears it next call
                    run.failure = error
                    self._fail_all(run, None, error)
        finally:
            run.task = None
            if run.failure is None:
                self._forget(run_id, run)

    @staticmethod
    def _fail_all(run: _RunQueue, batch: Batch | None, error: BusError) -> None:
        waiters = list(batch.waiters) if batch is not None else []
        waiters.extend(item.waiter for item in run.items if item.waiter is not None)
        run.items.clear()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)

    def discard(self, run_id: str) -> None:
        """Drop what the run queued (a start undone); a call in flight still ends."""
        run = self._runs.pop(run_id, None)
        if run is not None:
            self._fail_all(run, None, BusError(f"run {run_id!r} was discarded"))

    @property
    def writing(self) -> int:
        """Runs with queued events, or an error not yet reported."""
        return len(self._runs)

    async def aclose(self) -> None:
        """Wait for the calls in flight (each bounded by the bus's call timeout)."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks)
