"""Pipelined appends on a real Redis: events queued while a call is in flight go out together,
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
    """Holds each batch of one bus's writer before its Redis call until ``open``; records the
    batches (their seqs) in the order they were sent."""

    def __init__(self, bus: RedisBus) -> None:
        pipeline = bus.events._pipeline
        self._send = pipeline._send
        pipeline._send = self.send
        self.batches: list[list[int]] = []
        self.answered = 0
        self.held = asyncio.Event()
        self._open = asyncio.Event()
        self._changed = asyncio.Event()

    async def send(self, run_id: str, batch: Batch) -> BusError | None:
        self.batches.append([e.seq for e in batch.events])
        if not self._open.is_set():
            self.held.set()
            await self._open.wait()
        try:
            return await self._send(run_id, batch)
        finally:
            self.answered += 1
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
