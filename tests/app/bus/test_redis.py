"""The Redis bus on a real Redis: event logs (replay, follow, bounds, expiry, fencing),
session leases, routing between workers, the lost-run sweep, and Redis going away.

Each test has its own key prefix on the machine's Redis (removed afterwards); the outage
tests start a ``redis-server`` of their own on a spare port.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_runtime.extensions.external import ExternalEvent
from app.agents.build import load_config
from app.bus import BusError, BusUnavailable, LeaseLost, LogNotFound
from app.bus.redis import RedisBus, check_redis
from app.bus.wire import WireEncoder
from app.runs import RunManager
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import Store, open_store
from tests.support.buses import Buses, event, read_until_finished
from tests.support.managers import check_lost_run_ended, orphan, run_manager
from tests.support.services import REDIS_URL, RedisServer, drop_prefix, new_prefix
from tests.support.storage import TcpProxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def prefix() -> Iterator[str]:
    value = new_prefix()
    yield value
    drop_prefix(value)


@pytest.fixture
async def buses(prefix: str) -> AsyncIterator[Buses]:
    opened = Buses(prefix)
    try:
        yield opened
    finally:
        for bus in opened.opened:
            await bus.aclose()


async def gone(bus: RedisBus, run_id: str) -> bool:
    return not await bus.events.exists(run_id)


async def free(bus: RedisBus, session_id: str) -> bool:
    return await bus.locks.holder(session_id) is None


# --- event logs -----------------------------------------------------------------------------


async def test_replay_then_follow_from_another_worker(buses: Buses) -> None:
    writer, reader = await buses.open(), await buses.open()
    log = writer.events
    await log.create("run_1", session_id="s", fence=1)
    for seq in (1, 2, 3):
        await log.append("run_1", event(seq), fence=1)
    subscription = await reader.events.subscribe("run_1", after=1)
    assert [e.seq for e in await subscription.next()] == [2, 3]
    assert subscription.cursor == 3
    pending = asyncio.ensure_future(subscription.next())
    await wait_until(lambda: reader.events.follower.waiting == 1)
    assert not pending.done()
    await log.append("run_1", event(4), fence=1)
    first = [e.seq for e in await pending]
    await log.append("run_1", event(5, "run.completed"), fence=1)
    rest = await read_until_finished(subscription)
    assert first + rest == [4, 5]
    assert subscription.finished
    assert await subscription.next() == ()
    frames = [e.frame for e in (await (await reader.events.subscribe("run_1")).next())]
    assert frames == [
        event(seq, "run.completed" if seq == 5 else "text.delta").frame for seq in range(1, 6)
    ]
    await subscription.aclose()
    assert reader.events.subscribers == 1  # the one opened for the frames is still open


async def test_subscribing_after_the_end_finishes_at_once(buses: Buses) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    await bus.events.append("run_1", event(1, "run.cancelled"), fence=1)
    subscription = await bus.events.subscribe("run_1", after=1)
    assert await subscription.next() == ()
    assert subscription.finished
    await subscription.aclose()
    assert bus.events.subscribers == 0


async def test_interrupt_wakes_a_waiting_reader(buses: Buses) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    subscription = await bus.events.subscribe("run_1")
    pending = asyncio.ensure_future(subscription.next())
    await wait_until(lambda: bus.events.follower.waiting == 1)
    subscription.interrupt()
    assert await pending == ()
    assert not subscription.finished
    # an interrupt while not waiting is kept for the next call
    subscription.interrupt()
    assert await subscription.next() == ()
    # closing wakes a pending reader too
    pending = asyncio.ensure_future(subscription.next())
    await wait_until(lambda: bus.events.follower.waiting == 1)
    await subscription.aclose()
    assert await pending == ()
    await subscription.aclose()
    assert bus.events.subscribers == 0


async def test_append_checks_and_fencing(buses: Buses) -> None:
    log = (await buses.open()).events
    with pytest.raises(LogNotFound):
        await log.append("run_x", event(1), fence=1)
    with pytest.raises(LogNotFound):
        await log.subscribe("run_x")
    assert not await log.exists("run_x")
    assert await log.last_seq("run_x") is None
    await log.create("run_1", session_id="s", fence=7)
    with pytest.raises(BusError):
        await log.create("run_1", session_id="s", fence=7)
    with pytest.raises(LeaseLost):
        await log.append("run_1", event(1), fence=6)
    with pytest.raises(BusError):
        await log.append("run_1", event(2), fence=7)
    assert await log.last_seq("run_1") == 0
    await log.append("run_1", event(1), fence=7)
    # the same event again from the same writer (a retried call) is taken once
    await log.append("run_1", event(1), fence=7)
    assert await log.last_seq("run_1") == 1
    # a higher token takes over the log, and the old one is refused from then on
    await log.append("run_1", event(2, "run.failed"), fence=9)
    assert await log.last_seq("run_1") == 2
    with pytest.raises(BusError):
        await log.append("run_1", event(3), fence=9)
    with pytest.raises(LeaseLost):
        await log.append("run_1", event(3), fence=7)
    assert await log.exists("run_1")


async def test_bounded_log_drops_the_oldest(buses: Buses) -> None:
    bus = await buses.open(max_events=16)
    await bus.events.create("run_1", session_id="s", fence=1)
    for seq in range(1, 601):
        await bus.events.append("run_1", event(seq), fence=1)
    subscription = await bus.events.subscribe("run_1")
    kept = await subscription.next()
    # MAXLEN ~ trims whole stream nodes (100 entries each by default)
    assert 16 <= len(kept) <= 250
    assert [e.seq for e in kept] == list(range(kept[0].seq, 601))
    await subscription.aclose()


async def test_a_long_replay_comes_in_batches(buses: Buses) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    for seq in range(1, 2500):
        await bus.events.append("run_1", event(seq), fence=1)
    await bus.events.append("run_1", event(2500, "run.completed"), fence=1)
    subscription = await bus.events.subscribe("run_1", after=10)
    assert await read_until_finished(subscription) == list(range(11, 2501))
    await subscription.aclose()


async def test_sealed_logs_expire_and_live_ones_are_kept_alive(buses: Buses) -> None:
    bus = await buses.open(event_log_ttl=0.2, lease_seconds=1.0)
    lease = await bus.locks.acquire("s", "run_1", 1.0)
    assert lease is not None
    await bus.events.create("run_1", session_id="s", fence=lease.token)
    await bus.events.append("run_1", event(1), fence=lease.token)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        meta, stream = bus.keys.meta("run_1"), bus.keys.log("run_1")
        # unsealed: a live TTL (10 leases here), extended by each renewal
        assert 5_000 < client.pttl(meta) <= 10_000
        assert 5_000 < client.pttl(stream) <= 10_000
        client.pexpire(meta, 3_000)
        await bus.locks.renew(lease, 1.0)
        assert client.pttl(meta) > 5_000
        await bus.events.append("run_1", event(2, "run.completed"), fence=lease.token)
        assert client.pttl(meta) <= 200 and client.pttl(stream) <= 200
    finally:
        client.close()
    await wait_until(lambda: gone(bus, "run_1"))


# --- session locks --------------------------------------------------------------------------


async def test_session_locks(buses: Buses) -> None:
    one, two = await buses.open(), await buses.open()
    first = await one.locks.acquire("s", "run_a", 15)
    assert first is not None
    assert await two.locks.acquire("s", "run_b", 15) is None
    assert await two.locks.holder("s") == "run_a"
    await one.locks.renew(first, 15)
    await one.locks.release(first)
    assert await one.locks.holder("s") is None
    with pytest.raises(LeaseLost):
        await one.locks.renew(first, 15)
    second = await two.locks.acquire("s", "run_b", 15)
    assert second is not None and second.token > first.token
    await one.locks.release(first)  # a stale lease releases nothing
    assert await one.locks.holder("s") == "run_b"
    assert (one.locks.held, two.locks.held) == (0, 1)
    # many sessions' holders at once, in the order asked (one MGET)
    assert await one.locks.acquire("t", "run_c", 15) is not None
    assert await one.locks.holders(["t", "free", "s", "t"]) == ["run_c", None, "run_b", "run_c"]
    assert await two.locks.holders([]) == []
    # a retried acquire by the same holder gets its own lease back
    again = await two.locks.acquire("s", "run_b", 15)
    assert again == second
    # a worker renews its leases in one call: a lease it no longer holds says so alone
    third = await two.locks.acquire("u", "run_d", 15)
    assert third is not None
    assert await two.locks.renew_many([second, first, third], 15) == [True, False, True]
    assert await two.locks.renew_many([], 15) == []


async def test_a_resumed_runs_lease_is_not_handed_to_another_worker(buses: Buses) -> None:
    # a resumed run's lock is held under the run's own id, which any worker may name: one
    # worker resumed it; another, trying too, is refused instead of being handed that lease
    # (giving up, it would release the lock of the run going on elsewhere)
    one, two = await buses.open(), await buses.open()
    held = await one.locks.acquire("s", "run_r", 15, exclusive=True)
    assert held is not None
    assert await two.locks.acquire("s", "run_r", 15, exclusive=True) is None
    assert await one.locks.acquire("s", "run_r", 15, exclusive=True) is None
    await one.locks.renew(held, 15)
    assert await two.locks.holder("s") == "run_r"
    await one.locks.release(held)
    taken = await two.locks.acquire("s", "run_r", 15, exclusive=True)
    assert taken is not None and taken.token > held.token


async def test_a_lease_lapses_unless_renewed(buses: Buses) -> None:
    bus = await buses.open()
    lease = await bus.locks.acquire("s", "run_a", 0.2)
    assert lease is not None
    await asyncio.sleep(0.1)
    await bus.locks.renew(lease, 0.3)
    await asyncio.sleep(0.15)
    assert await bus.locks.holder("s") == "run_a"
    await wait_until(lambda: free(bus, "s"))
    with pytest.raises(LeaseLost):
        await bus.locks.renew(lease, 1)
    successor = await bus.locks.acquire("s", "run_b", 5)
    assert successor is not None and successor.token > lease.token


async def test_two_hundred_contenders_one_winner(buses: Buses) -> None:
    workers = [await buses.open() for _ in range(3)]
    leases = await asyncio.gather(
        *(workers[i % 3].locks.acquire("s", f"run_{i}", 15) for i in range(200))
    )
    won = [lease for lease in leases if lease is not None]
    assert len(won) == 1
    assert await workers[0].locks.holder("s") == won[0].holder


async def test_a_burst_waits_for_the_capped_pool_instead_of_opening_more(buses: Buses) -> None:
    bus = await buses.open(max_connections=2)
    name = f"agent:{bus.worker}"

    async def opened() -> int:
        admin = redis.Redis.from_url(REDIS_URL)
        try:
            clients = await asyncio.to_thread(admin.client_list)
        finally:
            admin.close()
        return sum(1 for client in clients if client["name"] == name)

    # 200 calls at once: each waits for one of the two connections in turn
    leases = await asyncio.gather(*(bus.locks.acquire(f"s{i}", f"run_{i}", 15) for i in range(200)))
    assert all(lease is not None for lease in leases)
    assert await opened() == 2
    holders = await bus.locks.holders([f"s{i}" for i in range(200)])
    assert holders == [f"run_{i}" for i in range(200)]


async def test_the_terminal_event_releases_the_lock_and_the_route(buses: Buses) -> None:
    bus = await buses.open()
    lease = await bus.locks.acquire("s", "run_1", 15)
    assert lease is not None
    await bus.events.create("run_1", session_id="s", fence=lease.token)
    await bus.router.register("run_1", "s")
    await bus.events.append("run_1", event(1), fence=lease.token)
    assert await bus.locks.holder("s") == "run_1"
    await bus.events.append("run_1", event(2, "run.completed"), fence=lease.token)
    assert await bus.locks.holder("s") is None
    assert await bus.router.cancel("run_1", "cancel_requested") is False
    await bus.locks.release(lease)
    await bus.router.unregister("run_1")
    assert bus.stats() == {
        "event_logs": 0,
        "live_event_logs": 0,
        "subscribers": 0,
        "locks": 0,
        "routed_runs": 0,
    }


async def test_a_sealing_with_another_token_leaves_the_lock_alone(buses: Buses) -> None:
    bus = await buses.open()
    lease = await bus.locks.acquire("s", "run_1", 15)
    assert lease is not None
    await bus.events.create("run_1", session_id="s", fence=lease.token)
    await bus.locks.release(lease)
    successor = await bus.locks.acquire("s", "run_2", 15)
    assert successor is not None
    # the lost run's end, written under the old token, must not free its successor's lock
    await bus.events.append("run_1", event(1, "run.failed"), fence=lease.token)
    assert await bus.locks.holder("s") == "run_2"


# --- routing --------------------------------------------------------------------------------


class Handler:
    def __init__(self, runs: set[str]) -> None:
        self.runs = runs
        # runs held here that cannot take an answer now (between owners): post it again
        self.settling: set[str] = set()
        self.calls: list[tuple[Any, ...]] = []

    def cancel_local(self, run_id: str, reason: str) -> bool:
        self.calls.append(("cancel", run_id, reason))
        return run_id in self.runs

    def deliver_local(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        self.calls.append(("deliver", session_id, run_id, event.name, dict(event.payload)))
        if run_id in self.settling:
            return None
        if run_id in self.runs or (run_id is None and session_id == "s-held"):
            return ["ConfirmationExtension"]
        return []


async def test_commands_reach_the_worker_holding_the_run(buses: Buses) -> None:
    holder, other = await buses.open(), await buses.open()
    held, elsewhere = Handler({"run_h"}), Handler(set())
    holder.router.bind(held)
    other.router.bind(elsewhere)
    lease = await holder.locks.acquire("s-held", "run_h", 15)
    assert lease is not None
    await holder.router.register("run_h", "s-held")
    assert other.stats()["routed_runs"] == 0 and holder.stats()["routed_runs"] == 1

    assert await other.router.cancel("run_h", "cancel_requested") is True
    assert held.calls[-1:] == [("cancel", "run_h", "cancel_requested")]
    accepted = await other.router.deliver_external(
        "s-held", "run_h", ExternalEvent("confirmation_response", {"a": 1})
    )
    assert accepted == ["ConfirmationExtension"]
    assert held.calls[-1:] == [("deliver", "s-held", "run_h", "confirmation_response", {"a": 1})]
    # without a run id, the answer goes to whichever run holds the session
    assert await other.router.deliver_external("s-held", None, ExternalEvent("n", {})) == [
        "ConfirmationExtension"
    ]
    # the holder's own refusal comes back as is
    held.runs.clear()
    assert await other.router.cancel("run_h", "cancel_requested") is False
    assert await other.router.deliver_external("s-held", "run_h", ExternalEvent("n", {})) == []
    # a holder that cannot speak for the run now says so: None, not a refusal
    held.settling.add("run_h")
    assert await other.router.deliver_external("s-held", "run_h", ExternalEvent("n", {})) is None
    held.settling.clear()
    # unknown runs are answered without asking anyone
    calls = len(held.calls)
    assert await other.router.cancel("run_nope", "cancel_requested") is False
    assert await other.router.deliver_external("s-free", None, ExternalEvent("n", {})) == []
    assert len(held.calls) == calls
    await holder.router.unregister("run_h")
    assert await other.router.cancel("run_h", "cancel_requested") is False


async def test_open_run_starts_the_log_and_routes_the_run_in_one_call(buses: Buses) -> None:
    holder, other = await buses.open(), await buses.open()
    held = Handler({"run_o"})
    holder.router.bind(held)
    other.router.bind(Handler(set()))
    await holder.open_run("run_o", session_id="s-open", fence=7)
    assert await other.events.exists("run_o")
    assert holder.stats()["routed_runs"] == 1
    assert await other.router.cancel("run_o", "cancel_requested") is True
    assert held.calls[-1:] == [("cancel", "run_o", "cancel_requested")]
    await holder.events.append("run_o", event(1, run_id="run_o"), fence=7)
    # a second start of the same run changes nothing: not the log, not where it is routed
    with pytest.raises(BusError):
        await other.open_run("run_o", session_id="s-open", fence=8)
    assert other.stats()["routed_runs"] == 0
    assert await other.events.last_seq("run_o") == 1
    assert await other.router.cancel("run_o", "cancel_requested") is True
    assert held.calls[-1:] == [("cancel", "run_o", "cancel_requested")]


async def test_claim_run_takes_the_lease_and_opens_the_run_in_one_call(buses: Buses) -> None:
    holder, other = await buses.open(), await buses.open()
    held = Handler({"run_c"})
    holder.router.bind(held)
    other.router.bind(Handler(set()))
    lease = await holder.claim_run("run_c", session_id="s-claim", ttl=5.0)
    assert lease is not None and lease.holder == "run_c" and lease.session_id == "s-claim"
    assert await other.locks.holder("s-claim") == "run_c"
    assert holder.stats() == {
        "event_logs": 1,
        "live_event_logs": 1,
        "subscribers": 0,
        "locks": 1,
        "routed_runs": 1,
    }
    assert await other.router.cancel("run_c", "cancel_requested") is True
    assert held.calls[-1:] == [("cancel", "run_c", "cancel_requested")]
    # the log's fence is the lease's token: a lower one is refused, the lease's own accepted
    with pytest.raises(LeaseLost):
        await holder.events.append("run_c", event(1, run_id="run_c"), fence=lease.token - 1)
    await holder.events.append("run_c", event(1, run_id="run_c"), fence=lease.token)
    assert await other.events.last_seq("run_c") == 1
    # the same call again (its answer lost, retried): the same token, nothing changed
    again = await holder.events.claim(
        "run_c", session_id="s-claim", lease_ttl_ms=5_000, route=holder.router.route
    )
    assert again == lease.token
    # a busy session: nothing taken, nothing opened, nothing routed
    assert await other.claim_run("run_d", session_id="s-claim", ttl=5.0) is None
    assert not await other.events.exists("run_d")
    assert other.stats()["routed_runs"] == 0 and other.stats()["locks"] == 0
    assert await holder.router.cancel("run_d", "cancel_requested") is False
    # a run that has a log already is not claimed again under another lease
    await other.open_run("run_e", session_id="s-other", fence=3)
    with pytest.raises(BusError, match="already has an event log"):
        await other.claim_run("run_e", session_id="s-other", ttl=5.0)
    assert await other.locks.holder("s-other") is None


async def test_a_claim_whose_answer_never_came_is_given_back(buses: Buses) -> None:
    bus, other = await buses.open(), await buses.open()
    log = bus.events
    script = log._claim  # the script call, as sent

    async def lost_answer(**call: Any) -> Any:
        await script(**call)  # it ran on the server, but the caller is cancelled meanwhile
        raise asyncio.CancelledError

    log._claim = lost_answer
    with pytest.raises(asyncio.CancelledError):
        await bus.claim_run("run_u", session_id="s-undo", ttl=5.0)

    async def given_back() -> bool:
        return await other.locks.holder("s-undo") is None and not await other.events.exists("run_u")

    await wait_until(given_back)
    assert await other.router.cancel("run_u", "cancel_requested") is False
    assert bus.stats()["locks"] == 0 and bus.stats()["routed_runs"] == 0
    # the session is free for the next start at once, not after the lease's ttl
    log._claim = script
    assert await bus.claim_run("run_v", session_id="s-undo", ttl=5.0) is not None


async def test_a_gone_worker_is_answered_for_at_once(buses: Buses) -> None:
    holder, other = await buses.open(), await buses.open()
    holder.router.bind(Handler({"run_h"}))
    other.router.bind(Handler(set()))
    await holder.router.register("run_h", "s")
    await holder.aclose()  # its channel has no subscriber any more; its route is still there
    started = time.monotonic()
    assert await other.router.cancel("run_h", "cancel_requested") is False
    # nobody could be asked: None (the caller tells "post it again" from "refused")
    assert await other.router.deliver_external("s", "run_h", ExternalEvent("n", {})) is None
    assert time.monotonic() - started < 1.0


async def test_a_silent_worker_costs_the_reply_timeout(buses: Buses, prefix: str) -> None:
    other = await buses.open(reply_timeout=0.3)
    other.router.bind(Handler(set()))
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    pubsub = client.pubsub()
    await pubsub.subscribe(other.keys.commands("mute-worker"))  # subscribed, never answers
    try:
        await client.set(other.keys.route("run_m"), "mute-worker", px=5000)
        started = time.monotonic()
        assert await other.router.cancel("run_m", "cancel_requested") is False
        assert 0.25 < time.monotonic() - started < 2.0
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


# --- the follower ---------------------------------------------------------------------------


async def test_many_readers_of_many_runs_on_one_follower(buses: Buses) -> None:
    writer, reader = await buses.open(), await buses.open()
    runs = [f"run_{index}" for index in range(20)]
    for run_id in runs:
        await writer.events.create(run_id, session_id="s", fence=1)

    async def follow(run_id: str, after: int) -> list[int]:
        subscription = await reader.events.subscribe(run_id, after=after)
        try:
            return await read_until_finished(subscription)
        finally:
            await subscription.aclose()

    readers = [asyncio.ensure_future(follow(run_id, 0)) for run_id in runs]

    async def write(run_id: str) -> None:
        for seq in range(1, 30):
            await writer.events.append(run_id, event(seq, run_id=run_id), fence=1)
            if seq % 7 == 0:
                await asyncio.sleep(0.01)
        await writer.events.append(run_id, event(30, "run.completed", run_id=run_id), fence=1)

    await wait_until(lambda: reader.events.follower.waiting == len(runs))
    late = [asyncio.ensure_future(follow(run_id, 3)) for run_id in runs[:5]]
    await asyncio.gather(*(write(run_id) for run_id in runs))
    for result in await asyncio.gather(*readers):
        assert result == list(range(1, 31))
    for result in await asyncio.gather(*late):
        assert result == list(range(4, 31))
    assert reader.events.subscribers == 0
    assert reader.events.follower.waiting == 0


async def test_a_waiter_behind_the_pending_read_is_not_served_from_it(buses: Buses) -> None:
    # A read issued from seq 3 returns seq 4; a waiter at seq 2 joined after it was issued.
    # Serving it from that read would skip seq 3: it must wait for the next read instead.
    # (The run is written on another worker: this one follows it through XREAD.)
    writer, bus = await buses.open(), await buses.open()
    await writer.events.create("run_1", session_id="s", fence=1)
    for seq in range(1, 5):
        await writer.events.append("run_1", event(seq), fence=1)
    follower = bus.events.follower
    ahead = follower.wait("run_1", 3)
    behind = follower.wait("run_1", 2)
    fourth = event(4)
    entry = (b"4-0", {b"t": fourth.type.encode(), b"f": fourth.frame})
    follower._dispatch([[f"{buses.prefix}log:run_1".encode(), [entry]]], {"run_1": 3})
    assert [e.seq for e in ahead.future.result()] == [4]
    assert not behind.future.done()
    async with asyncio.timeout(2):
        assert [e.seq for e in await behind.future] == [3, 4]
    follower.discard(ahead)
    follower.discard(behind)
    assert follower.waiting == 0


async def test_a_reader_that_joins_while_the_follower_waits_is_not_missed(buses: Buses) -> None:
    writer, reader = await buses.open(), await buses.open()
    for run_id in ("run_a", "run_b"):
        await writer.events.create(run_id, session_id="s", fence=1)
    first = await reader.events.subscribe("run_a")
    pending_a = asyncio.ensure_future(first.next())
    follower = reader.events.follower
    # the follower now blocks on run_a only
    await wait_until(lambda: follower.waiting == 1 and follower._reading)
    second = await reader.events.subscribe("run_b")
    pending_b = asyncio.ensure_future(second.next())
    await wait_until(lambda: follower.waiting == 2)
    started = time.monotonic()
    await writer.events.append("run_b", event(1, run_id="run_b"), fence=1)
    async with asyncio.timeout(2):
        assert [e.seq for e in await pending_b] == [1]
    assert time.monotonic() - started < 3.0  # well before the XREAD's own 5 s timeout
    assert not pending_a.done()
    await first.aclose()
    await second.aclose()
    assert await pending_a == ()


async def test_a_reader_that_joins_while_the_follower_marks_its_bell_is_not_missed(
    buses: Buses,
) -> None:
    # The follower's first act is to add an entry to its bell and read from it. A reader
    # that joins meanwhile must be in that read: a ring of the bell sent then would land
    # before the follower's own entry, and a read from that entry would not see it.
    writer, reader = await buses.open(), await buses.open()
    for run_id in ("run_a", "run_b"):
        await writer.events.create(run_id, session_id="s", fence=1)
    follower = reader.events.follower
    marking = asyncio.Event()
    marked = asyncio.Event()
    bell_xadd = follower._bell_xadd

    async def slow_mark(client: Any) -> bytes:
        if client is follower._client and not marked.is_set():
            marking.set()
            await marked.wait()
        return await bell_xadd(client)

    follower._bell_xadd = slow_mark  # type: ignore[method-assign]
    first = await reader.events.subscribe("run_a")
    pending_a = asyncio.ensure_future(first.next())
    await marking.wait()
    second = await reader.events.subscribe("run_b")
    pending_b = asyncio.ensure_future(second.next())
    await wait_until(lambda: follower.waiting == 2)
    await wait_until(lambda: not follower._rings)  # a ring, if any, has landed
    marked.set()
    await wait_until(lambda: follower._reading)
    await writer.events.append("run_b", event(1, run_id="run_b"), fence=1)
    async with asyncio.timeout(2):  # well before the XREAD's own 5 s timeout
        assert [e.seq for e in await pending_b] == [1]
    assert not pending_a.done()
    await first.aclose()
    await second.aclose()
    assert await pending_a == ()


async def test_a_deleted_log_ends_its_readers(buses: Buses) -> None:
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    await bus.events.append("run_1", event(1), fence=1)
    subscription = await bus.events.subscribe("run_1")
    assert [e.seq for e in await subscription.next()] == [1]
    bus.events.discard("run_1")
    await wait_until(lambda: gone(bus, "run_1"))
    subscription.interrupt()  # what an SSE response's ping does
    assert await subscription.next() == ()
    assert await subscription.next() == ()
    assert subscription.finished
    await subscription.aclose()


# --- the sweep of lost runs -----------------------------------------------------------------


async def test_orphans_are_unsealed_logs_without_a_route(buses: Buses) -> None:
    bus = await buses.open()
    for run_id, session in (("run_held", "s1"), ("run_lost", "s2"), ("run_done", "s3")):
        await bus.events.create(run_id, session_id=session, fence=1)
    await bus.router.register("run_held", "s1")
    await bus.events.append("run_done", event(1, "run.completed", run_id="run_done"), fence=1)
    assert await bus.events.orphans() == [("run_lost", "s2")]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.delete(bus.keys.meta("run_lost"))  # expired
    finally:
        client.close()
    assert await bus.events.orphans() == []
    bus.events.discard("run_held")


@pytest.fixture
async def manager_on_redis(
    tmp_path: Path, buses: Buses
) -> AsyncIterator[tuple[RunManager, Store, RedisBus]]:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/a.db", lease_seconds=30)
    store = await open_store(settings.database_url)
    bus = await buses.open(lease_seconds=30)
    agent = await build_agent(settings, load_config(None))
    manager = run_manager(agent, store, bus)
    try:
        yield manager, store, bus
    finally:
        await manager.aclose()
        await agent.aclose()
        await store.close()


async def test_the_sweep_fails_lost_runs_and_seals_their_logs(
    manager_on_redis: tuple[RunManager, Store, RedisBus], buses: Buses
) -> None:
    manager, store, bus = manager_on_redis
    reader_bus = await buses.open()
    await orphan(store, bus, "run_dead", "s-dead")
    await orphan(store, bus, "run_alive", "s-alive")
    alive = await bus.locks.acquire("s-alive", "run_alive", 30)  # its worker still renews
    assert alive is not None
    assert sorted(await bus.events.orphans()) == [("run_alive", "s-alive"), ("run_dead", "s-dead")]
    await bus.router.register("run_alive", "s-alive")
    reader = await reader_bus.events.subscribe("run_dead", after=2)
    waiting = asyncio.ensure_future(reader.next())
    assert await manager.reap_lost_runs() == 1
    async with asyncio.timeout(5):
        (terminal,) = await waiting
    assert terminal.seq == 3
    assert terminal.document["data"]["error"]["code"] == "worker_lost"
    assert reader.finished
    await reader.aclose()
    await check_lost_run_ended(manager, store, bus)
    assert await bus.events.orphans() == []


async def test_the_sweep_seals_a_log_its_worker_left_open_after_storing_the_end(
    manager_on_redis: tuple[RunManager, Store, RedisBus],
) -> None:
    """The worker stored the run's outcome, then died before appending its terminal event."""
    manager, store, bus = manager_on_redis
    await orphan(store, bus, "run_half", "s-half")
    await store.update_run(
        "run_half", status="completed", output={"content": "done"}, usage={"input_tokens": 1}
    )
    reader = await bus.events.subscribe("run_half", after=2)
    assert await manager.reap_lost_runs() == 0  # nothing failed: its end was known
    async with asyncio.timeout(5):
        (terminal,) = await reader.next()
    assert terminal.type == "run.completed" and terminal.seq == 3
    assert terminal.document["data"]["output"] == {"content": "done"}
    await reader.aclose()
    record = await store.get_run("run_half")
    assert record is not None and record.status == "completed"
    assert await bus.events.orphans() == []


async def test_the_sweep_stores_the_end_a_log_has_but_the_store_missed(
    manager_on_redis: tuple[RunManager, Store, RedisBus],
) -> None:
    """The log got the run's end (store unreachable at the time), the store did not."""
    manager, store, bus = manager_on_redis
    await orphan(store, bus, "run_log", "s-log")
    end = WireEncoder("run_log", "s-log").encode(
        3, "run.failed", 0.0, {"error": {"code": "internal", "message": "boom"}}
    )
    await bus.events.append("run_log", end, fence=1)
    assert await manager.reap_lost_runs() == 0
    record = await store.get_run("run_log")
    assert record is not None and record.status == "failed"
    assert record.error == {"code": "internal", "message": "boom"}


# --- Redis going away -----------------------------------------------------------------------


async def test_check_redis_names_the_problem_in_one_line() -> None:
    with pytest.raises(BusUnavailable) as caught:
        await check_redis("redis://user:hunter2@127.0.0.1:1/0", timeout=2)
    message = str(caught.value)
    assert "\n" not in message and "hunter2" not in message
    assert "127.0.0.1:1" in message


async def test_a_redis_outage_fails_calls_quickly_and_the_bus_recovers(
    tmp_path: Path, buses: Buses
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        writer = await buses.open(server.url, lease_seconds=1.0)
        reader = await buses.open(server.url, lease_seconds=1.0)
        writer.router.bind(Handler({"run_1"}))
        await writer.events.create("run_1", session_id="s", fence=1)
        await writer.router.register("run_1", "s")
        subscription = await reader.events.subscribe("run_1")
        pending = asyncio.ensure_future(subscription.next())
        await wait_until(lambda: reader.events.follower.waiting == 1)
        server.stop()
        started = time.monotonic()
        with pytest.raises(BusUnavailable):
            await writer.events.append("run_1", event(1), fence=1)
        with pytest.raises(BusUnavailable):
            await reader.locks.acquire("s2", "run_2", 5)
        with pytest.raises(BusUnavailable):
            await reader.router.cancel("run_1", "cancel_requested")
        assert time.monotonic() - started < 10
        # a reader rides the outage out, and answers its interrupts meanwhile
        await asyncio.sleep(0.3)
        assert not pending.done()
        subscription.interrupt()
        async with asyncio.timeout(2):
            assert await pending == ()
        # Redis comes back empty (no persistence): the log is gone, its reader ends
        server.start()
        async with asyncio.timeout(10):
            while True:
                batch = await subscription.next()
                assert batch == ()
                if subscription.finished:
                    break
        await subscription.aclose()
        # and everything works again, scripts included (reloaded after the restart)
        async with asyncio.timeout(10):
            while True:
                try:
                    lease = await writer.locks.acquire("s3", "run_3", 5)
                    break
                except BusUnavailable:
                    await asyncio.sleep(0.1)
        assert lease is not None
        await writer.events.create("run_3", session_id="s3", fence=lease.token)
        await writer.router.register("run_3", "s3")
        writer.router.bind(Handler({"run_3"}))
        # once the writer's listener has subscribed again
        await wait_until(lambda: reader.router.cancel("run_3", "cancel_requested"), within=10)
        follow = await reader.events.subscribe("run_3")
        await writer.events.append(
            "run_3", event(1, "run.completed", run_id="run_3"), fence=lease.token
        )
        assert await read_until_finished(follow) == [1]
        await follow.aclose()
    finally:
        server.stop()


async def test_a_reader_gives_up_after_the_outage_grace(tmp_path: Path, buses: Buses) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        bus = await buses.open(server.url, outage_grace=0.5)
        await bus.events.create("run_1", session_id="s", fence=1)
        subscription = await bus.events.subscribe("run_1")
        server.stop()
        with pytest.raises(BusUnavailable):
            async with asyncio.timeout(15):
                while True:
                    await subscription.next()
        await subscription.aclose()
    finally:
        server.stop()


async def test_interrupt_returns_while_a_read_is_stuck_on_a_black_holed_redis(
    buses: Buses,
) -> None:
    # A read that Redis never answers (packets dropped) lasts its whole call timeout; an SSE
    # response interrupts its reader to send its pings, and must not wait for that read.
    proxy = TcpProxy(int(REDIS_URL.rsplit(":", 1)[1].split("/")[0]))
    await proxy.start()
    try:
        bus = await buses.open(f"redis://127.0.0.1:{proxy.port}/0")
        writer = await buses.open()  # the run is written on another worker
        await writer.events.create("run_1", session_id="s", fence=1)
        subscription = await bus.events.subscribe("run_1")
        subscription.interrupt()
        assert await subscription.next() == ()  # the next call reads the log itself
        proxy.stall()
        pending = asyncio.ensure_future(subscription.next())
        await wait_until(lambda: _reading(subscription))
        subscription.interrupt()
        async with asyncio.timeout(30):  # a safety net: the read itself is still stuck
            assert await pending == ()
        assert await _reading(subscription), "the interrupt waited for the stuck read"
        # Redis answers again: the same read goes on, and the events come
        proxy.resume()
        await writer.events.append("run_1", event(1, "run.completed"), fence=1)
        assert await read_until_finished(subscription) == [1]
        await subscription.aclose()
    finally:
        proxy.resume()
        await proxy.cut()


async def _reading(subscription: Any) -> bool:
    reading = subscription._reading
    return reading is not None and not reading.done()


async def test_a_bus_closes_while_its_follower_is_mid_call(buses: Buses) -> None:
    # the follower starts its first call (the bell, on a new connection) when a reader first
    # waits; closing the bus at once cancels it inside redis-py's wait_for of a drain, which
    # Python 3.11 may swallow: the close must still end
    bus = await buses.open()
    await bus.events.create("run_1", session_id="s", fence=1)
    subscription = await bus.events.subscribe("run_1")
    reading = asyncio.create_task(subscription.next())
    await asyncio.sleep(0)
    await bus.events.append("run_1", event(1), fence=1)
    assert [e.seq for e in await reading] == [1]
    await subscription.aclose()
    async with asyncio.timeout(5):
        await bus.aclose()
