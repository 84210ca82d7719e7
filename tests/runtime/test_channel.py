"""The bounded channel between a run's task and its stream."""

from __future__ import annotations

import asyncio

import pytest

from agent_runtime.channel import Channel, ChannelClosed
from tests.support.waiting import wait_until


async def test_items_flow_in_order_and_close_ends_the_reader() -> None:
    channel: Channel[int] = Channel(limit=4)
    for item in range(3):
        await channel.put(item)
    channel.close()
    assert [await channel.get() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ChannelClosed):
        await channel.get()


async def test_a_full_channel_holds_the_writer_until_the_reader_takes_one() -> None:
    channel: Channel[int] = Channel(limit=2)
    await channel.put(1)
    await channel.put(2)
    writer = asyncio.create_task(channel.put(3))
    await wait_until(lambda: bool(channel._put_waiters))
    assert not writer.done() and len(channel) == 2
    assert await channel.get() == 1
    await writer
    assert [await channel.get(), await channel.get()] == [2, 3]


async def test_put_nowait_ignores_the_limit() -> None:
    channel: Channel[str] = Channel(limit=1)
    await channel.put("a")
    channel.put_nowait("terminal")
    assert len(channel) == 2


async def test_consumer_idle_means_everything_taken_and_asking_for_more() -> None:
    channel: Channel[int] = Channel()
    await channel.put(1)
    idle = asyncio.create_task(channel.wait_consumer_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    assert await channel.get() == 1
    await asyncio.sleep(0)
    assert not idle.done()  # took the item but is not yet waiting for the next one
    reader = asyncio.create_task(channel.get())
    await idle
    channel.put_nowait(2)
    assert await reader == 2


async def test_a_cancelled_writer_leaves_no_waiter_behind() -> None:
    channel: Channel[int] = Channel(limit=1)
    await channel.put(1)
    writer = asyncio.create_task(channel.put(2))
    await wait_until(lambda: bool(channel._put_waiters))
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert await channel.get() == 1
    assert len(channel) == 0


async def test_tap_takes_items_only_while_the_consumer_waits_with_nothing_buffered() -> None:
    channel: Channel[int] = Channel()
    tapped: list[int] = []

    def tap(item: int) -> bool:
        if item % 2:
            return False
        tapped.append(item)
        return True

    channel.tap = tap
    # no consumer waiting yet: buffered, whatever the tap would say
    await channel.put(0)
    assert len(channel) == 1 and not tapped
    assert await channel.get() == 0
    reader = asyncio.create_task(channel.get())
    await wait_until(lambda: channel._get_waiter is not None)
    await channel.put(2)  # taken by the tap: the reader stays parked
    assert tapped == [2] and not reader.done()
    await channel.put(3)  # declined: it goes to the reader, which is woken
    await channel.put(4)  # the reader has not run since it was woken: buffered behind 3
    assert tapped == [2]
    assert await reader == 3
    assert await channel.get() == 4


async def test_tapped_and_streamed_events_keep_the_run_order() -> None:
    """AgentCore.stream's tap: the deltas it takes plus the events streamed are the run's
    events in order, the same as without a tap."""
    from agent_runtime import AgentCore
    from agent_runtime.events import AgentEvent, AgentEventType
    from agent_runtime.testing import ScriptedModel

    taken = 0

    async def run(tap_deltas: bool) -> list[str]:
        nonlocal taken
        seen: list[str] = []

        def tap(event: AgentEvent) -> bool:
            nonlocal taken
            if event.type is not AgentEventType.TEXT_DELTA or not tap_deltas:
                return False
            seen.append(f"tap:{event.delta}")
            taken += 1
            return True

        core = AgentCore(model=ScriptedModel(["one two three four five six"], delay=0.001))
        async for event in core.stream("hi", tap=tap):
            if event.type is AgentEventType.TEXT_DELTA:
                seen.append(f"tap:{event.delta}")  # as the tap would have named it
            else:
                seen.append(event.type.value)
                # a consumer busy with an event: deltas meanwhile are buffered, not tapped
                await asyncio.sleep(0.003)
        await core.aclose()
        return seen

    plain = await run(tap_deltas=False)
    assert taken == 0
    tapped = await run(tap_deltas=True)
    assert tapped == plain
    assert taken > 0
    assert plain[0] == "run.started" and plain[-1] == "run.completed"
