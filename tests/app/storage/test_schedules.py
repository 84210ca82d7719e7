"""The store's schedules on both backends: CRUD, and claims raced from several connections."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from app.storage import RunRecord, Store
from app.storage.schedules import FiringFence, FiringLost, FiringRecord, ScheduleRecord
from tests.support.storage import OpenStore, open_backend_fixture, store_fixture

__all__ = ["open_backend_fixture", "store_fixture"]

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def _schedule(principal: str = "alice", **changes: object) -> ScheduleRecord:
    values: dict[str, object] = {
        "id": f"sch_{'0' * 31}1",
        "principal": principal,
        "agent": "default",
        "input": "report",
        "cron": "* * * * *",
        "at": None,
        "timezone": "UTC",
        "session_id": None,
        "end_count": None,
        "end_at": None,
        "misfire": "skip",
        "paused": False,
        "next_due_at": T0,
        "created_at": T0 - timedelta(hours=1),
        "updated_at": T0 - timedelta(hours=1),
    }
    values.update(changes)
    return ScheduleRecord(**values)  # type: ignore[arg-type]


def _firing(schedule: ScheduleRecord, due: datetime, now: datetime) -> FiringRecord:
    return FiringRecord(
        schedule_id=schedule.id, due_at=due, status="claimed", token=1, lease_until=now + LEASE
    )


async def test_crud_and_ownership(store: Store) -> None:
    mine = _schedule()
    theirs = _schedule("bob", id=f"sch_{'0' * 31}2")
    await store.create_schedule(mine)
    await store.create_schedule(theirs)
    assert await store.get_schedule(mine.id) == mine
    assert [s.id for s in await store.list_schedules("alice")] == [mine.id]
    changed = dataclasses.replace(mine, input="again", paused=True)
    assert await store.update_schedule(changed)
    got = await store.get_schedule(mine.id)
    assert got is not None
    assert (got.input, got.paused) == ("again", True)
    assert await store.due_schedules(T0, 10) == [theirs]  # paused ones are not due
    assert await store.delete_schedule(mine.id)
    assert not await store.delete_schedule(mine.id)
    assert await store.get_schedule(mine.id) is None


async def test_one_claim_per_due_time_raced_from_three_connections(
    open_backend: OpenStore,
) -> None:
    stores = [await open_backend() for _ in range(3)]
    schedule = _schedule()
    await stores[0].create_schedule(schedule)
    due = T0
    for _ in range(5):  # five due times, each raced by the three workers
        read = [await store.get_schedule(schedule.id) for store in stores]
        assert all(r is not None and r.next_due_at == due for r in read)
        following = due + timedelta(minutes=1)
        won = await asyncio.gather(
            *(
                store.claim_due(r, following, _firing(schedule, due, due))
                for store, r in zip(stores, read, strict=True)
                if r is not None
            )
        )
        assert sorted(won) == [False, False, True]
        due = following
    firings = await stores[1].list_firings(schedule.id, 10)
    assert [f.due_at for f in firings] == [T0 + timedelta(minutes=m) for m in range(4, -1, -1)]
    final = await stores[2].get_schedule(schedule.id)
    assert final is not None
    assert (final.fired_count, final.next_due_at) == (5, T0 + timedelta(minutes=5))


async def test_a_stale_read_loses_and_a_skip_does_not_count(store: Store) -> None:
    schedule = _schedule()
    await store.create_schedule(schedule)
    skipped = FiringRecord(
        schedule_id=schedule.id, due_at=T0, status="skipped", token=1, lease_until=T0, missed=3
    )
    assert await store.claim_due(schedule, T0 + timedelta(minutes=1), skipped)
    # the same read again (another worker's, older): refused
    assert not await store.claim_due(schedule, T0 + timedelta(minutes=1), _firing(schedule, T0, T0))
    after = await store.get_schedule(schedule.id)
    assert after is not None
    assert after.fired_count == 0
    assert [(f.status, f.missed) for f in await store.list_firings(schedule.id)] == [("skipped", 3)]
    # nothing to take over: a skipped firing is settled
    assert await store.reclaim_firings(T0 + timedelta(hours=1), T0 + timedelta(hours=2), 10) == []


async def test_a_dead_workers_firing_is_taken_over_once_and_fenced(
    open_backend: OpenStore,
) -> None:
    stores = [await open_backend() for _ in range(3)]
    schedule = _schedule()
    await stores[0].create_schedule(schedule)
    claimed = _firing(schedule, T0, T0)
    assert await stores[0].claim_due(schedule, T0 + timedelta(minutes=1), claimed)
    # the lease still runs: nobody takes it over
    assert await stores[1].reclaim_firings(T0 + LEASE / 2, T0 + LEASE * 2, 10) == []
    later = T0 + LEASE
    taken = await asyncio.gather(
        *(store.reclaim_firings(later, later + LEASE, 10) for store in stores[1:])
    )
    winners = [firing for batch in taken for firing in batch]
    assert len(winners) == 1
    [winner] = winners
    assert (winner.token, winner.lease_until) == (2, later + LEASE)
    # the dead worker's token no longer settles anything; the new holder's does
    assert not await stores[0].settle_firing(claimed, status="started", run_id="run_old")
    assert await stores[1].settle_firing(winner, status="started", run_id="run_new")
    assert not await stores[2].settle_firing(winner, status="failed", detail="twice")
    [firing] = await stores[2].list_firings(schedule.id)
    assert (firing.status, firing.run_id, firing.attempts) == ("started", "run_new", 1)


def _run(run_id: str, session_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        session_id=session_id,
        principal="alice",
        agent="default",
        input="report",
        status="running",
    )


async def test_a_firings_run_is_created_only_by_its_current_holder(
    open_backend: OpenStore,
) -> None:
    stalled, other = await open_backend(), await open_backend()
    schedule = _schedule()
    await stalled.create_schedule(schedule)
    claimed = _firing(schedule, T0, T0)
    assert await stalled.claim_due(schedule, T0 + timedelta(minutes=1), claimed)
    await stalled.get_or_create_session("firing-session", "alice")
    # the holder stalls past its lease; another worker takes the firing over
    later = T0 + LEASE
    [winner] = await other.reclaim_firings(later, later + LEASE, 10)
    old = FiringFence(schedule.id, T0, claimed.token)
    new = FiringFence(schedule.id, T0, winner.token)
    # both insert at once: only the current token's run is stored
    results = await asyncio.gather(
        stalled.create_run(_run("run_stale", "firing-session"), firing=old),
        other.create_run(_run("run_current", "firing-session"), firing=new),
        return_exceptions=True,
    )
    assert isinstance(results[0], FiringLost), results
    assert results[1] is None
    assert await stalled.get_run("run_stale") is None  # rolled back with the refusal
    [firing] = await other.list_firings(schedule.id)
    assert (firing.status, firing.run_id, firing.token) == ("started", "run_current", 2)
    # started: neither token creates another run for it
    with pytest.raises(FiringLost):
        await other.create_run(_run("run_again", "firing-session"), firing=new)
    assert [run.run_id for run in await other.list_runs("firing-session", None)] == ["run_current"]


async def test_a_retrying_firing_waits_for_its_time(store: Store) -> None:
    schedule = _schedule()
    await store.create_schedule(schedule)
    claimed = _firing(schedule, T0, T0)
    assert await store.claim_due(schedule, None, claimed)
    retry_at = T0 + timedelta(seconds=5)
    assert await store.settle_firing(
        claimed, status="retrying", detail="overloaded: full", lease_until=retry_at
    )
    assert await store.reclaim_firings(retry_at - timedelta(seconds=1), retry_at + LEASE, 10) == []
    [again] = await store.reclaim_firings(retry_at, retry_at + LEASE, 10)
    assert (again.status, again.token, again.attempts, again.detail) == (
        "claimed",
        2,
        1,
        "overloaded: full",
    )
    ended = await store.get_schedule(schedule.id)
    assert ended is not None
    assert ended.next_due_at is None  # claimed with no following due time: ended
    assert await store.due_schedules(T0 + timedelta(days=1), 10) == []


async def test_deleting_a_schedule_deletes_its_firings(store: Store) -> None:
    schedule = _schedule()
    await store.create_schedule(schedule)
    assert await store.claim_due(schedule, None, _firing(schedule, T0, T0))
    assert await store.delete_schedule(schedule.id)
    assert await store.list_firings(schedule.id) == []
    assert await store.reclaim_firings(T0 + LEASE, T0 + LEASE * 2, 10) == []
