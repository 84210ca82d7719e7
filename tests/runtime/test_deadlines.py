"""Deadlines on one timer of the loop: called in order at their time, cancelled for good, and
``RunDeadline`` behaving as ``asyncio.timeout`` does."""

from __future__ import annotations

import asyncio

import pytest

from agent_runtime.deadlines import _COMPACT_AT, Deadlines, RunDeadline
from tests.support.waiting import wait_until


async def test_deadlines_fire_in_order_of_their_time_on_one_timer() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines.of(loop)
    assert Deadlines.of(loop) is deadlines
    fired: list[str] = []
    now = loop.time()
    deadlines.at(now + 0.03, fired.append, "third")
    deadlines.at(now + 0.01, fired.append, "first")
    deadlines.at(now + 0.02, fired.append, "second")
    assert len(deadlines) == 3
    await wait_until(lambda: len(fired) == 3)
    assert fired == ["first", "second", "third"]
    assert len(deadlines) == 0


async def test_a_cancelled_deadline_is_not_called_and_lets_go_of_its_argument() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines.of(loop)
    fired: list[object] = []
    kept = object()
    soon = deadlines.at(loop.time() + 0.01, fired.append, kept)
    later = deadlines.at(loop.time() + 0.02, fired.append, "later")
    soon.cancel()
    soon.cancel()  # idempotent
    assert not soon.active and soon._arg is None
    assert len(deadlines) == 1
    await wait_until(lambda: fired == ["later"])
    assert not later.active


async def test_cancelled_entries_are_dropped_once_they_are_most_of_the_heap() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines.of(loop)
    entries = [deadlines.at(loop.time() + 3600, print, n) for n in range(_COMPACT_AT * 2)]
    for entry in entries[: _COMPACT_AT + 1]:
        entry.cancel()
    assert len(deadlines._heap) == _COMPACT_AT - 1  # rebuilt without the cancelled ones
    for entry in entries:
        entry.cancel()
    assert len(deadlines) == 0 and deadlines._timer is None


async def test_a_failing_callback_does_not_hold_up_the_others() -> None:
    loop = asyncio.get_running_loop()
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
    fired: list[str] = []

    def fail(_: object) -> None:
        raise ValueError("boom")

    deadlines = Deadlines.of(loop)
    deadlines.at(loop.time() + 0.01, fail, None)
    deadlines.at(loop.time() + 0.01, fired.append, "after")
    await wait_until(lambda: fired == ["after"])
    assert [type(error) for error in errors] == [ValueError]


async def test_run_deadline_turns_its_own_cancellation_into_timeout_error() -> None:
    with pytest.raises(TimeoutError), RunDeadline(0.01) as deadline:
        await asyncio.sleep(10)
    assert deadline.expired()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_run_deadline_without_a_limit_or_left_in_time_changes_nothing() -> None:
    with RunDeadline(None) as unlimited:
        await asyncio.sleep(0)
    with RunDeadline(10) as limited:
        await asyncio.sleep(0)
    assert not unlimited.expired() and not limited.expired()
    assert len(Deadlines.of(asyncio.get_running_loop())) == 0


async def test_run_deadline_lets_a_cancellation_from_elsewhere_through() -> None:
    started = asyncio.Event()

    async def limited() -> None:
        with RunDeadline(10):
            started.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(limited())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
