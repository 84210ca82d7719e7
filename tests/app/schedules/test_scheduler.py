"""The scheduler on a running app: real runs through the run manager, a clock the test moves.

Several schedulers on their own store connections stand for several workers; a worker's death
is its tick cancelled mid-firing. Nothing sleeps: each step waits for state it can observe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.errors import Overloaded
from app.runs.handle import RunRequestOptions
from app.schedules import Scheduler, Schedules, ScheduleSpec, firing_session
from app.storage import Store, open_store
from app.storage.schedules import ScheduleRecord
from tests.support.served import Serve, Served
from tests.support.waiting import wait_until

T0 = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
LEASE = 30.0


class Clock:
    """A clock the test moves."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


StartRun = Callable[[str, str, RunRequestOptions], Awaitable[str]]


def real_start(served: Served) -> StartRun:
    async def start(principal: str, session_id: str, options: RunRequestOptions) -> str:
        return (await served.services.manager.submit(principal, session_id, options)).run_id

    return start


@contextlib.asynccontextmanager
async def workers(served: Served, count: int) -> AsyncIterator[list[Store]]:
    """``count`` store connections of their own on the app's database."""
    url = served.services.settings.database_url
    stores = [await open_store(url) for _ in range(count)]
    try:
        yield stores
    finally:
        await asyncio.gather(*(store.close() for store in stores))


def scheduler(store: Store, start: StartRun, clock: Clock, **options: Any) -> Scheduler:
    return Scheduler(store, start, lease_seconds=LEASE, misfire_grace=60.0, clock=clock, **options)


async def create(served: Served, clock: Clock, **spec: Any) -> ScheduleRecord:
    schedules = Schedules(served.services.store, ("default",), clock=clock)
    values: dict[str, Any] = {"agent": "default", "input": "tick", "cron": "* * * * *"}
    values.update(spec)
    return await schedules.create("anonymous", ScheduleSpec(**values))


async def runs_of(served: Served, schedule: ScheduleRecord, due: datetime) -> list[str]:
    session = schedule.session_id or firing_session(schedule.id, due)
    return [run.run_id for run in await served.services.store.list_runs(session, None)]


async def test_three_workers_fire_each_due_time_once(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock)
        due = T0.replace(second=0) + timedelta(minutes=1)
        assert schedule.next_due_at == due
        async with workers(served, 3) as stores:
            racers = [scheduler(store, real_start(served), clock) for store in stores]
            for minute in range(3):
                clock.now = due + timedelta(minutes=minute)
                fired = await asyncio.gather(*(racer.tick() for racer in racers))
                assert sorted(fired) == [0, 0, 1]
                # and again at the same time: nothing more is due
                assert sum(await asyncio.gather(*(racer.tick() for racer in racers))) == 0
        firings = await served.services.store.list_firings(schedule.id)
        assert [f.due_at for f in firings] == [due + timedelta(minutes=m) for m in (2, 1, 0)]
        assert {f.status for f in firings} == {"started"}
        for firing in firings:
            assert await runs_of(served, schedule, firing.due_at) == [firing.run_id]
            run = await served.services.store.get_run(firing.run_id or "")
            assert run is not None
            assert run.metadata["schedule_id"] == schedule.id
        stored = await served.services.store.get_schedule(schedule.id)
        assert stored is not None
        assert stored.fired_count == 3


async def test_a_worker_killed_at_the_due_time_fires_once_through_another(
    serve: Serve,
) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock, session_id="nightly")
        stuck = asyncio.Event()

        async def hangs(principal: str, session_id: str, options: RunRequestOptions) -> str:
            stuck.set()
            await asyncio.Event().wait()  # never returns: the worker dies here
            raise AssertionError("unreachable")

        async with workers(served, 2) as (doomed_store, survivor_store):
            doomed = scheduler(doomed_store, hangs, clock)
            survivor = scheduler(survivor_store, real_start(served), clock)
            clock.now = schedule.next_due_at or T0
            dying = asyncio.create_task(doomed.tick())
            await stuck.wait()
            dying.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dying
            assert await survivor.tick() == 0  # its lease still runs
            clock.advance(seconds=LEASE)
            assert await survivor.tick() == 1
            assert await survivor.tick() == 0
        [firing] = await served.services.store.list_firings(schedule.id)
        assert (firing.status, firing.token) == ("started", 2)
        assert await runs_of(served, schedule, firing.due_at) == [firing.run_id]


async def test_a_worker_killed_after_starting_the_run_causes_no_second_run(
    serve: Serve,
) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock)
        started: list[str] = []

        async def starts_then_dies(
            principal: str, session_id: str, options: RunRequestOptions
        ) -> str:
            started.append(await real_start(served)(principal, session_id, options))
            raise asyncio.CancelledError  # killed before it recorded the run

        async with workers(served, 2) as (doomed_store, survivor_store):
            clock.now = schedule.next_due_at or T0
            with pytest.raises(asyncio.CancelledError):
                await scheduler(doomed_store, starts_then_dies, clock).tick()
            clock.advance(seconds=LEASE)
            survivor = scheduler(survivor_store, real_start(served), clock)
            assert await survivor.tick() == 0  # taken over, and found already started
        [firing] = await served.services.store.list_firings(schedule.id)
        assert (firing.status, firing.run_id) == ("started", started[0])
        assert await runs_of(served, schedule, firing.due_at) == started


async def test_a_worker_stalled_past_its_lease_starts_nothing(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock, session_id="stalls")
        held, resume = asyncio.Event(), asyncio.Event()

        async def stalls(principal: str, session_id: str, options: RunRequestOptions) -> str:
            held.set()
            await resume.wait()  # a GC pause, SIGSTOP, a slow network: the lease runs out
            return await real_start(served)(principal, session_id, options)

        async with workers(served, 2) as (stalled_store, other_store):
            stalled = scheduler(stalled_store, stalls, clock)
            other = scheduler(other_store, real_start(served), clock)
            clock.now = schedule.next_due_at or T0
            stalling = asyncio.create_task(stalled.tick())
            await held.wait()
            clock.advance(seconds=LEASE)
            assert await other.tick() == 1  # took the firing over and started its run
            [firing] = await served.services.store.list_firings(schedule.id)
            assert (firing.status, firing.token) == ("started", 2)
            resume.set()
            assert await stalling == 0  # its start was refused: it fired nothing
        assert await runs_of(served, schedule, firing.due_at) == [firing.run_id]
        [after] = await served.services.store.list_firings(schedule.id)
        assert (after.status, after.run_id, after.token) == ("started", firing.run_id, 2)


@pytest.mark.parametrize("misfire", ["skip", "run_once"])
async def test_misfire_after_a_restart(serve: Serve, misfire: str) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock, misfire=misfire)
        first = schedule.next_due_at
        assert first is not None
        # the service was down for ten minutes; a new worker starts
        clock.now = first + timedelta(minutes=9, seconds=30)
        restarted = scheduler(served.services.store, real_start(served), clock)
        fired = await restarted.tick()
        [firing] = await served.services.store.list_firings(schedule.id)
        latest = first + timedelta(minutes=9)
        assert firing.due_at == latest
        stored = await served.services.store.get_schedule(schedule.id)
        assert stored is not None
        assert stored.next_due_at == latest + timedelta(minutes=1)
        if misfire == "skip":
            assert (fired, firing.status, firing.missed, firing.run_id) == (0, "skipped", 10, None)
            assert stored.fired_count == 0
        else:
            assert (fired, firing.status, firing.missed) == (1, "started", 9)
            assert await runs_of(served, schedule, latest) == [firing.run_id]
            assert stored.fired_count == 1
        # a due time found within the grace is not a misfire
        clock.now = latest + timedelta(minutes=1, seconds=50)
        assert await restarted.tick() == 1


async def test_a_refused_firing_is_retried_after_retry_after(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock, end_after=1)
        refusals = [Overloaded("no slot free", retry_after=3.0)]

        async def refused_once(principal: str, session_id: str, options: RunRequestOptions) -> str:
            if refusals:
                raise refusals.pop()
            return await real_start(served)(principal, session_id, options)

        worker = scheduler(served.services.store, refused_once, clock)
        clock.now = schedule.next_due_at or T0
        assert await worker.tick() == 0
        [firing] = await served.services.store.list_firings(schedule.id)
        assert (firing.status, firing.detail) == ("retrying", "overloaded: no slot free")
        assert firing.lease_until == clock.now + timedelta(seconds=3)
        clock.advance(seconds=2)
        assert await worker.tick() == 0
        clock.advance(seconds=1)
        assert await worker.tick() == 1
        [firing] = await served.services.store.list_firings(schedule.id)
        assert (firing.status, firing.attempts) == ("started", 2)
        # end_after 1: the schedule has ended
        stored = await served.services.store.get_schedule(schedule.id)
        assert stored is not None
        assert stored.next_due_at is None
        run = await served.services.store.get_run(firing.run_id or "")
        assert run is not None

        async def finished() -> bool:
            found = await served.services.store.get_run(firing.run_id or "")
            return found is not None and found.is_finished

        await wait_until(finished)


async def test_a_refusal_for_good_is_recorded_as_failed(serve: Serve) -> None:
    async with serve(scheduler_enabled=False) as served:
        clock = Clock(T0)
        schedule = await create(served, clock, session_id="theirs")
        await served.services.store.get_or_create_session("theirs", "someone-else")
        worker = scheduler(served.services.store, real_start(served), clock)
        clock.now = schedule.next_due_at or T0
        assert await worker.tick() == 0
        [firing] = await served.services.store.list_firings(schedule.id)
        assert firing.status == "failed"
        assert (firing.detail or "").startswith("not_found:")


async def test_the_lifespan_starts_and_stops_the_scheduler(serve: Serve) -> None:
    async with serve(scheduler_poll_interval=0.01) as served:
        running = served.services.scheduler
        assert running is not None
        task = running._task
        assert task is not None
        assert not task.done()
    assert task.done()
    assert not task.cancelled()  # it stopped on its own, between ticks
