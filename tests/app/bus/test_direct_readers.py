"""A subscription's ``direct`` reader: the events a log takes while ``next`` waits are offered
to it in the appending task (on Redis, once confirmed); those it takes advance the cursor and
``next`` goes on waiting; the rest, and the run's end, come from ``next`` in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from app.bus import WireEvent
from app.bus.base import EventLog, Subscription
from app.bus.local import LocalEventLog
from tests.support.buses import Buses, event
from tests.support.services import drop_prefix, new_prefix


class Direct:
    """Takes text deltas whose seq is not in ``refuse``; records what it took."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.refuse = refuse or set()
        self.taken: list[int] = []

    def __call__(self, events: Sequence[WireEvent]) -> bool:
        if any(e.terminal or e.seq in self.refuse for e in events):
            return False
        self.taken += [e.seq for e in events]
        return True


@pytest.fixture(params=["local", pytest.param("redis", marks=pytest.mark.redis)])
async def log(request: pytest.FixtureRequest) -> AsyncIterator[EventLog]:
    if request.param == "local":
        yield LocalEventLog()
        return
    prefix = new_prefix()
    buses = Buses(prefix)
    try:
        yield (await buses.open()).events
    finally:
        for bus in buses.opened:
            await bus.aclose()
        drop_prefix(prefix)


async def _append(log: EventLog, seq: int, type_: str = "text.delta") -> None:
    # awaited: on Redis the batch is confirmed (and its readers fed) when it returns
    await log.append("run_1", event(seq, type_), fence=1)


async def _settled(reading: asyncio.Task[Sequence[WireEvent]]) -> None:
    """Let the reader's task run until it waits (or has returned)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_direct_reader_takes_events_while_next_waits(log: EventLog) -> None:
    await log.create("run_1", session_id="s", fence=1)
    subscription: Subscription = await log.subscribe("run_1")
    direct = Direct(refuse={3})
    subscription.direct = direct  # type: ignore[attr-defined]
    reading = asyncio.create_task(subscription.next())
    await _settled(reading)
    for seq in (1, 2):
        await _append(log, seq)
    # taken in the appending task: the reader's next goes on waiting, its cursor moved
    assert direct.taken == [1, 2]
    assert not reading.done() and subscription.cursor == 2
    # one the reader leaves: next returns it, after the ones taken
    await _append(log, 3)
    async with asyncio.timeout(5):
        assert [e.seq for e in await reading] == [3]
    # while the reader is not waiting, nothing is offered: next returns it
    await _append(log, 4)
    async with asyncio.timeout(5):
        assert [e.seq for e in await subscription.next()] == [4]
    assert direct.taken == [1, 2]
    # the run's end is never taken directly: next returns it and the reader is finished
    reading = asyncio.create_task(subscription.next())
    await _settled(reading)
    await _append(log, 5)
    await _append(log, 6, "run.completed")
    async with asyncio.timeout(5):
        seqs = [e.seq for e in await reading]
        while not subscription.finished:
            seqs += [e.seq for e in await subscription.next()]
    assert direct.taken == [1, 2, 5]
    assert seqs == [6]
    await subscription.aclose()


async def test_a_failing_direct_reader_is_dropped_and_loses_nothing(log: EventLog) -> None:
    await log.create("run_1", session_id="s", fence=1)
    subscription: Subscription = await log.subscribe("run_1")

    def broken(events: Sequence[WireEvent]) -> bool:
        raise RuntimeError("a reader's bug")

    subscription.direct = broken  # type: ignore[attr-defined]
    reading = asyncio.create_task(subscription.next())
    await _settled(reading)
    await _append(log, 1)  # the append itself does not fail
    async with asyncio.timeout(5):
        assert [e.seq for e in await reading] == [1]
    assert subscription.direct is None  # type: ignore[attr-defined]
    await _append(log, 2, "run.completed")
    async with asyncio.timeout(5):
        assert [e.seq for e in await subscription.next()] == [2]
    await subscription.aclose()
