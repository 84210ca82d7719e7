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
