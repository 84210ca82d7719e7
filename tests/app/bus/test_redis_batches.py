"""Coalesced appends on a real Redis: events queued while a call is in flight go out together,
a batch ends at a terminal event, a stale fence refuses its whole batch (and what was queued
after it), and no reader, here or on another worker, sees an event before Redis holds it.

Each test holds a batch in flight at a gate in front of the Redis call, so "during a batch"
is a state the test waits for, not a moment it sleeps until.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from app.bus import BusError, LeaseLost, WireEvent
from app.bus.redis import RedisBus
from app.bus.redis.writer import Batch
from tests.support.buses import Buses, event, read_until_finished
from tests.support.services import drop_prefix, new_prefix

pytestmark = pytest.mark.redis


@pytest.fixture
async def buses() -> AsyncIterator[Buses]:
    value = new_prefix()
    opened = Buses(value)
    try:
        yield opened
    finally:
        for bus in opened.opened:
            await bus.aclose()
        drop_prefix(value)


class Gate:
    """Holds each call of one bus's writer before it reaches Redis until ``open``; records the
    batches (their seqs) in the order they were sent."""

    def __init__(self, bus: RedisBus) -> None:
        pipeline = bus.events._pipeline
        self._send = pipeline._send
        pipeline._send = self.send
        self.batches: list[list[int]] = []
        self.calls: list[int] = []  # the batches in each call
        self.answered = 0
        self.held = asyncio.Event()
        self._open = asyncio.Event()
        self._changed = asyncio.Event()

    async def send(self, batches: Sequence[tuple[str, Batch]]) -> Sequence[BusError | None]:
        self.batches.extend([e.seq for e in batch.events] for _, batch in batches)
        self.calls.append(len(batches))
        if not self._open.is_set():
            self.held.set()
            await self._open.wait()
        try:
            return await self._send(batches)
        finally:
            self.answered += len(batches)
            self._changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait (up to 5 s) until ``done()``, looking again after each answered batch."""
        async with asyncio.timeout(5):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    def open(self) -> None:
        self._open.set()


async def _quiet(pending: asyncio.Future[Sequence[WireEvent]]) -> bool:
    """True if the read has still returned nothing after the other tasks had their turns
    (the events it could see are held at the gate, so nothing may come)."""
    for _ in range(20):
        await asyncio.sleep(0.005)
    return not pending.done()


async def test_events_queued_during_an_append_go_out_together(buses: Buses) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    gate = Gate(bus)
    bus.events.append_nowait("run_1", event(1), fence=1)
    await gate.held.wait()  # seq 1 is in flight
    for seq in range(2, 6):
        bus.events.append_nowait("run_1", event(seq), fence=1)
    gate.open()
    await bus.events.append("run_1", event(6, "run.completed"), fence=1)
    assert gate.batches == [[1], [2, 3, 4, 5, 6]]
    subscription = await bus.events.subscribe("run_1")
    assert await read_until_finished(subscription) == [1, 2, 3, 4, 5, 6]
    await subscription.aclose()
    assert bus.events._pipeline.writing == 0


async def test_a_batch_crossing_a_terminal_event(buses: Buses) -> None:
    bus, other = await buses.open(), await buses.open()
    lease = await bus.locks.acquire("s", "run_1", 15)
    assert lease is not None
    fence = lease.token
    await bus.events.create("run_1", session_id="s", fence=fence)
    local = await bus.events.subscribe("run_1")
    remote = await other.events.subscribe("run_1")
    gate = Gate(bus)
    bus.events.append_nowait("run_1", event(1), fence=fence)
    await gate.held.wait()
    # queued behind the call in flight: 2, the terminal 3, and 4 after the end
    bus.events.append_nowait("run_1", event(2), fence=fence)
    ending = asyncio.ensure_future(
        bus.events.append("run_1", event(3, "run.completed"), fence=fence)
    )
    await asyncio.sleep(0)  # the terminal append has queued its event
    bus.events.append_nowait("run_1", event(4), fence=fence)
    assert not ending.done()
    gate.open()
    await ending
    # the terminal event ended its batch: 4 went alone, after the seal, and was refused
    assert gate.batches[:2] == [[1], [2, 3]]
    assert await bus.events.terminal_seq("run_1") == 3
    assert await bus.locks.holder("s") is None  # released in the sealing call
    await gate.until(lambda: gate.answered >= 3)
    assert gate.batches[2] == [4]
    with pytest.raises(BusError, match="sealed"):
        bus.events.append_nowait("run_1", event(5), fence=fence)
    for subscription in (local, remote):
        got: list[int] = []
        async with asyncio.timeout(5):
            while not subscription.finished:
                for item in await subscription.next():
                    # a reader is told the end only once the log holds it
                    if item.terminal:
                        assert await bus.events.terminal_seq("run_1") == item.seq
                    got.append(item.seq)
        assert got == [1, 2, 3]
        await subscription.aclose()
    assert await bus.events.last_seq("run_1") == 3


async def test_a_stale_fence_in_the_middle_of_a_batch(buses: Buses) -> None:
    writer, successor = await buses.open(), await buses.open()
    await writer.events.create("run_1", session_id="s", fence=5)
    await writer.events.append("run_1", event(1), fence=5)
    reader = await writer.events.subscribe("run_1", after=1)
    gate = Gate(writer)
    writer.events.append_nowait("run_1", event(2), fence=5)
    await gate.held.wait()  # 2 is on its way; 3 and 4 queue behind it
    writer.events.append_nowait("run_1", event(3), fence=5)
    writer.events.append_nowait("run_1", event(4), fence=5)
    # meanwhile another worker takes the run over and writes its end under a newer token
    await successor.events.append("run_1", event(2, "run.failed"), fence=9)
    gate.open()
    await gate.until(lambda: gate.answered >= 1)
    await asyncio.sleep(0)  # the writer's task takes the answer after the gate sees it
    # the whole batch was refused, and what was queued after it dropped (it would leave a gap)
    assert gate.batches == [[2]]
    with pytest.raises(LeaseLost):
        writer.events.append_nowait("run_1", event(5), fence=5)
    # the run's end (the finalizer's awaited terminal append) hears it too, and is the last
    with pytest.raises(LeaseLost):
        await writer.events.append("run_1", event(5, "run.failed"), fence=5)
    assert writer.events._pipeline.writing == 0
    assert writer.stats()["live_event_logs"] == 0
    # the local reader never saw the refused events: it sees the successor's end at seq 2
    batch = await reader.next()
    assert [(e.seq, e.type) for e in batch] == [(2, "run.failed")]
    assert reader.finished
    await reader.aclose()


async def test_a_lower_fence_queued_after_a_higher_one_is_its_own_refused_batch(
    buses: Buses,
) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=5)
    gate = Gate(bus)
    bus.events.append_nowait("run_1", event(1), fence=7)
    bus.events.append_nowait("run_1", event(2), fence=7)
    stale = asyncio.ensure_future(bus.events.append("run_1", event(3), fence=5))
    await gate.held.wait()
    gate.open()
    with pytest.raises(LeaseLost):
        await stale
    assert gate.batches == [[1, 2], [3]]
    assert await bus.events.last_seq("run_1") == 2


async def test_a_reader_on_another_worker_during_a_batch(buses: Buses) -> None:
    writer, elsewhere = await buses.open(), await buses.open()
    await writer.events.create("run_1", session_id="s", fence=1)
    remote = await elsewhere.events.subscribe("run_1")
    local = await writer.events.subscribe("run_1")
    gate = Gate(writer)
    for seq in range(1, 4):
        writer.events.append_nowait("run_1", event(seq), fence=1)
    await gate.held.wait()
    pending_remote = asyncio.ensure_future(remote.next())
    pending_local = asyncio.ensure_future(local.next())
    # the batch is in flight: the log holds none of it, so no reader sees any of it
    assert await _quiet(pending_remote)
    assert await _quiet(pending_local)
    assert await writer.events.last_seq("run_1") == 0
    gate.open()
    seen: dict[str, list[int]] = {"remote": [], "local": []}
    for name, pending in (("remote", pending_remote), ("local", pending_local)):
        first = await pending
        last = await writer.events.last_seq("run_1")
        assert last is not None
        assert all(item.seq <= last for item in first)
        seen[name].extend(item.seq for item in first)
    await writer.events.append("run_1", event(4, "run.completed"), fence=1)
    for name, subscription in (("remote", remote), ("local", local)):
        seen[name].extend(await read_until_finished(subscription))
        await subscription.aclose()
    assert seen == {"remote": [1, 2, 3, 4], "local": [1, 2, 3, 4]}


async def test_the_batches_of_several_runs_go_out_in_one_call(buses: Buses) -> None:
    bus = await buses.open()
    for run_id, fence in (("run_a", 1), ("run_b", 1), ("run_c", 4)):
        await bus.events.create(run_id, session_id=f"s-{run_id}", fence=fence)
    gate = Gate(bus)
    bus.events.append_nowait("run_a", event(1, run_id="run_a"), fence=1)
    await gate.held.wait()  # run_a's seq 1 is in flight; the three runs queue behind it
    bus.events.append_nowait("run_a", event(2, run_id="run_a"), fence=1)
    bus.events.append_nowait("run_b", event(1, run_id="run_b"), fence=1)
    bus.events.append_nowait("run_b", event(2, run_id="run_b"), fence=1)
    stale = asyncio.ensure_future(bus.events.append("run_c", event(1, run_id="run_c"), fence=3))
    await asyncio.sleep(0)  # the awaited append has queued its event
    gate.open()
    with pytest.raises(LeaseLost):
        await stale
    # one call for the first event, one for the three runs' batches (run_b's, run_c's, then
    # run_a's, queued again once its first batch was answered)
    assert gate.calls == [1, 3]
    assert gate.batches == [[1], [1, 2], [1], [2]]
    # run_c's stale batch was refused alone: the other runs' batches in its call were written
    assert await bus.events.last_seq("run_a") == 2
    assert await bus.events.last_seq("run_b") == 2
    assert await bus.events.last_seq("run_c") == 0


async def test_a_reader_here_behind_what_was_confirmed_reads_the_log(buses: Buses) -> None:
    # a run written here feeds its readers here from memory; one that starts waiting behind
    # what Redis already confirmed (it read the log just before a batch came back) is sent to
    # read the log again, not left waiting for a batch that may never come
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    subscription = await bus.events.subscribe("run_1")
    for seq in (1, 2):
        await bus.events.append("run_1", event(seq), fence=1)
    waiter = bus.events.follower.wait("run_1", 0)
    assert waiter.future.done() and waiter.future.result() == ()
    async with asyncio.timeout(5):
        assert [e.seq for e in await subscription.next()] == [1, 2]
    await subscription.aclose()


async def test_a_run_given_up_here_is_followed_through_redis(buses: Buses) -> None:
    # the worker that wrote the run gives its lease back (handed over); another worker goes
    # on writing it: the first worker's reader gets those events through XREAD
    first, second = await buses.open(), await buses.open()
    lease = await first.locks.acquire("s", "run_1", 15)
    assert lease is not None
    await first.events.create("run_1", session_id="s", fence=lease.token)
    await first.events.append("run_1", event(1), fence=lease.token)
    reader = await first.events.subscribe("run_1", after=1)
    pending = asyncio.ensure_future(reader.next())
    await first.locks.release(lease)
    successor = await second.locks.acquire("s", "run_1", 15)
    assert successor is not None and successor.token > lease.token
    await second.events.append("run_1", event(2), fence=successor.token)
    async with asyncio.timeout(5):
        assert [e.seq for e in await pending] == [2]
    await second.events.append("run_1", event(3, "run.completed"), fence=successor.token)
    assert await read_until_finished(reader) == [3]
    await reader.aclose()


async def test_a_crash_inside_the_window_loses_no_event_a_reader_saw(buses: Buses) -> None:
    # The writer dies while a call is held in its window: the events it queued never reach
    # Redis, and no reader, on its worker or another, has seen any of them. The worker that
    # takes the run over goes on from the log's last seq, so every reader's stream stays one
    # contiguous story.
    writer, elsewhere, successor = [await buses.open() for _ in range(3)]
    lease = await writer.locks.acquire("s", "run_1", 15)
    assert lease is not None
    await writer.events.create("run_1", session_id="s", fence=lease.token)
    for seq in (1, 2):
        await writer.events.append("run_1", event(seq), fence=lease.token)
    local = await writer.events.subscribe("run_1")
    remote = await elsewhere.events.subscribe("run_1")
    seen: dict[str, list[int]] = {"local": [], "remote": []}
    for name, subscription in (("local", local), ("remote", remote)):
        async with asyncio.timeout(5):
            while len(seen[name]) < 2:
                seen[name].extend(e.seq for e in await subscription.next())
    gate = Gate(writer)
    for seq in (3, 4, 5):
        writer.events.append_nowait("run_1", event(seq), fence=lease.token)
    await gate.held.wait()  # 3..5 are held in the window
    pending = {
        "local": asyncio.ensure_future(local.next()),
        "remote": asyncio.ensure_future(remote.next()),
    }
    for name in ("local", "remote"):
        assert await _quiet(pending[name]), f"the {name} reader saw an event Redis lacks"
    # the crash: the writer's sender dies with its call, the worker with it
    task = writer.events._pipeline._task
    assert task is not None
    task.cancel()
    await asyncio.wait([task])
    await writer.locks.release(lease)  # its lease lapses (released here to skip the wait)
    assert await successor.events.last_seq("run_1") == 2
    taken = await successor.locks.acquire("s", "run_1", 15)
    assert taken is not None
    await successor.events.append("run_1", event(3, "run.failed"), fence=taken.token)
    for name in ("local", "remote"):
        async with asyncio.timeout(5):
            seen[name].extend(e.seq for e in await pending[name])
        subscription = local if name == "local" else remote
        seen[name].extend(await read_until_finished(subscription))
        await subscription.aclose()
    assert seen == {"local": [1, 2, 3], "remote": [1, 2, 3]}
    async with asyncio.timeout(5):
        tail = await (await successor.events.subscribe("run_1", after=2)).next()
    assert [(e.seq, e.type) for e in tail] == [(3, "run.failed")]


async def test_events_of_one_window_share_a_call(buses: Buses) -> None:
    # the first event after a quiet spell goes out at once; what comes within the window
    # after that call began waits for the next call, together
    bus = await buses.open()
    bus.events._pipeline._window = 0.5  # wide enough that the test's own pace cannot split it
    for run_id in ("run_a", "run_b"):
        await bus.events.create(run_id, session_id=f"s-{run_id}", fence=1)
    gate = Gate(bus)
    gate.open()
    await bus.events.append("run_a", event(1, run_id="run_a"), fence=1)
    assert gate.calls == [1]
    bus.events.append_nowait("run_a", event(2, run_id="run_a"), fence=1)
    bus.events.append_nowait("run_b", event(1, run_id="run_b"), fence=1)
    await bus.events.append("run_b", event(2, run_id="run_b"), fence=1)
    assert gate.calls == [1, 2]
    assert gate.batches == [[1], [2], [1, 2]]
