"""The in-process bus: event logs (replay, follow, bounds, expiry), session locks, routing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_runtime.extensions.external import ExternalEvent
from app.bus import BusError, LeaseLost, LocalBus, LogNotFound, WireEvent
from app.bus.local import LocalEventLog, LocalSessionLocks
from app.bus.wire import WireEncoder
from tests.support.waiting import wait_until


def event(seq: int, type_: str = "text.delta") -> WireEvent:
    return WireEncoder("run_1", "s").encode(seq, type_, 0.0, {"delta": str(seq)})


async def test_replay_then_follow() -> None:
    log = LocalEventLog()
    await log.create("run_1", session_id="s", fence=1)
    for seq in (1, 2, 3):
        await log.append("run_1", event(seq), fence=1)
    subscription = await log.subscribe("run_1", after=1)
    assert [e.seq for e in await subscription.next()] == [2, 3]
    assert subscription.cursor == 3
    pending = asyncio.ensure_future(subscription.next())
    await wait_until(lambda: subscription._waiter is not None)
    assert not pending.done()
    await log.append("run_1", event(4), fence=1)
    await log.append("run_1", event(5, "run.completed"), fence=1)
    assert [e.seq for e in await pending] == [4, 5]
    assert subscription.finished
    assert await subscription.next() == ()
    await subscription.aclose()
    assert log.subscribers == 0


async def test_subscribing_after_the_end_finishes_at_once() -> None:
    log = LocalEventLog()
    await log.create("run_1", session_id="s", fence=1)
    await log.append("run_1", event(1, "run.cancelled"), fence=1)
    subscription = await log.subscribe("run_1", after=1)
    assert await subscription.next() == ()
    assert subscription.finished
    await subscription.aclose()


async def test_a_log_begun_again_after_a_restart_is_read_from_its_start_past_it() -> None:
    # A run resumed after a restart of the process goes on in a new log from its checkpoint's
    # seq (2); a reader that saw seq 6 of the lost log, or 4 of this one, cannot tell which:
    # it reads this log from its start, the run.resumed first. One before the checkpoint's
    # seq reads on from where it was.
    log = LocalEventLog()
    await log.create("run_1", session_id="s", fence=1)
    log.skip_to("run_1", 2)
    for seq, type_ in ((3, "run.resumed"), (4, "text.delta"), (5, "text.delta")):
        await log.append("run_1", event(seq, type_), fence=1)
    for after in (6, 4, 3):
        subscription = await log.subscribe("run_1", after=after)
        assert [e.seq for e in await subscription.next()] == [3, 4, 5]
        await subscription.aclose()
    subscription = await log.subscribe("run_1", after=1)
    assert [e.seq for e in await subscription.next()] == [3, 4, 5]
    await subscription.aclose()
    with pytest.raises(BusError, match="not empty"):
        log.skip_to("run_1", 9)


async def test_interrupt_wakes_a_waiting_reader() -> None:
    log = LocalEventLog()
    await log.create("run_1", session_id="s", fence=1)
    subscription = await log.subscribe("run_1")
    pending = asyncio.ensure_future(subscription.next())
    await wait_until(lambda: subscription._waiter is not None)
    subscription.interrupt()
    assert await pending == ()
    assert not subscription.finished
    # an interrupt while not waiting is kept for the next call
    subscription.interrupt()
    assert await subscription.next() == ()
    await subscription.aclose()
    await subscription.aclose()
    assert log.subscribers == 0


async def test_append_checks() -> None:
    log = LocalEventLog()
    with pytest.raises(LogNotFound):
        await log.append("run_x", event(1), fence=1)
    with pytest.raises(LogNotFound):
        await log.subscribe("run_x")
    await log.create("run_1", session_id="s", fence=7)
    with pytest.raises(BusError):
        await log.create("run_1", session_id="s", fence=7)
    with pytest.raises(LeaseLost):
        await log.append("run_1", event(1), fence=6)
    with pytest.raises(BusError):
        await log.append("run_1", event(2), fence=7)
    assert await log.last_seq("run_1") == 0
    await log.append("run_1", event(1), fence=7)
    # a higher token takes over the log, and the old one is refused from then on
    await log.append("run_1", event(2, "run.failed"), fence=9)
    assert await log.last_seq("run_1") == 2
    with pytest.raises(BusError):
        await log.append("run_1", event(3), fence=9)
    with pytest.raises(LeaseLost):
        await log.append("run_1", event(3), fence=7)
    assert await log.last_seq("run_x") is None


async def test_bounded_log_drops_the_oldest() -> None:
    log = LocalEventLog(max_events=16)
    await log.create("run_1", session_id="s", fence=1)
    for seq in range(1, 101):
        await log.append("run_1", event(seq), fence=1)
    subscription = await log.subscribe("run_1")
    kept = await subscription.next()
    assert 16 <= len(kept) <= 32
    assert kept[-1].seq == 100
    assert [e.seq for e in kept] == list(range(kept[0].seq, 101))
    await subscription.aclose()


async def test_sealed_logs_expire() -> None:
    log = LocalEventLog(ttl=0.01)
    await log.create("run_1", session_id="s", fence=1)
    await log.append("run_1", event(1, "run.completed"), fence=1)
    assert await log.exists("run_1")

    async def gone() -> bool:
        return not await log.exists("run_1")

    await wait_until(gone)
    assert log.logs == 0


async def test_session_locks() -> None:
    locks = LocalSessionLocks()
    first = await locks.acquire("s", "run_a", 15)
    assert first is not None
    assert await locks.acquire("s", "run_b", 15) is None
    assert await locks.holder("s") == "run_a"
    await locks.renew(first, 15)
    await locks.release(first)
    assert await locks.holder("s") is None
    with pytest.raises(LeaseLost):
        await locks.renew(first, 15)
    second = await locks.acquire("s", "run_b", 15)
    assert second is not None and second.token > first.token
    await locks.release(first)  # a stale lease releases nothing
    assert await locks.holder("s") == "run_b"
    assert locks.held == 1
    assert await locks.acquire("t", "run_c", 15) is not None
    assert await locks.holders(["t", "free", "s"]) == ["run_c", None, "run_b"]


class Handler:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def cancel_local(self, run_id: str, reason: str) -> bool:
        self.calls.append(("cancel", run_id, reason))
        return run_id == "known"

    def deliver_local(self, session_id: str, run_id: str | None, event: ExternalEvent) -> list[str]:
        self.calls.append(("deliver", session_id, run_id, event.name, dict(event.payload)))
        return ["Ext"]


async def test_router_goes_to_the_local_handler() -> None:
    bus = LocalBus()
    assert await bus.router.cancel("known", "cancel_requested") is False  # nobody bound yet
    handler = Handler()
    bus.router.bind(handler)
    await bus.router.register("known", "s")
    assert bus.stats()["routed_runs"] == 1
    assert await bus.router.cancel("known", "cancel_requested") is True
    assert await bus.router.cancel("other", "cancel_requested") is False
    assert await bus.router.deliver_external("s", None, ExternalEvent("n", {"a": 1})) == ["Ext"]
    await bus.router.unregister("known")
    assert bus.stats()["routed_runs"] == 0
    await bus.aclose()


async def test_finished_logs_are_bounded_in_total() -> None:
    log = LocalEventLog(max_retained=10)
    for index in range(5):
        run_id = f"run_{index}"
        await log.create(run_id, session_id="s", fence=1)
        for seq in range(1, 4):
            await log.append(run_id, event(seq), fence=1)
        await log.append(run_id, event(4, "run.completed"), fence=1)
    # 4 events per run, 10 at most in total: only the two most recent runs are kept
    assert [await log.exists(f"run_{i}") for i in range(5)] == [False, False, False, True, True]
    log.close()
