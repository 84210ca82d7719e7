"""``stop_tasks``: a background task is stopped even when its first cancellation is swallowed
(Python 3.11's ``asyncio.wait_for`` drops one that meets its inner future done)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from app.tasks import stop_task, stop_tasks


def _swallowing_loop(inner: asyncio.Future[None], entered: asyncio.Event) -> asyncio.Task[None]:
    async def loop() -> None:
        entered.set()
        await asyncio.wait_for(inner, timeout=60)
        await asyncio.Event().wait()  # the loop's next wait: only a cancellation ends it

    return asyncio.get_running_loop().create_task(loop())


async def _cancelled_as_its_future_completes() -> tuple[asyncio.Task[None], bool]:
    inner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()
    task = _swallowing_loop(inner, entered)
    await entered.wait()
    await asyncio.sleep(0)  # the task now waits in wait_for
    inner.set_result(None)
    task.cancel()  # in the same step as the completion: wait_for may drop it
    done, _ = await asyncio.wait([task], timeout=0.5)
    return task, bool(done)


async def test_a_cancellation_wait_for_swallowed_is_repeated() -> None:
    task, ended_on_first = await _cancelled_as_its_future_completes()
    if sys.version_info < (3, 12):
        assert not ended_on_first  # the hazard itself: one cancel() leaves the loop running
    async with asyncio.timeout(5):
        await stop_task(task, again_after=0.05)
    assert task.cancelled()


async def test_stop_tasks_ends_every_task_and_leaves_their_outcomes() -> None:
    async def fails() -> None:
        raise RuntimeError("its owner's business")

    async def sleeps() -> None:
        await asyncio.sleep(3600)

    failed = asyncio.create_task(fails())
    await asyncio.wait([failed])
    sleeping = asyncio.create_task(sleeps())
    await stop_tasks([failed, sleeping])
    assert sleeping.cancelled()
    assert isinstance(failed.exception(), RuntimeError)
    await stop_task(None)


async def test_a_cancellation_of_the_caller_propagates() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue  # ends only once released: the caller's own cancellation must get out

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    stopping = asyncio.create_task(stop_task(task, again_after=0.01))
    await asyncio.sleep(0.05)  # a few rounds of cancelling
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not task.done()
    released.set()
    await task
