"""How a run's start takes its session's lease on Redis: with the run's log and route in one
call when nothing must happen under the lease first (the common start), and in two steps
when something must (a wait for a slot, a turn to replace)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus.base import Lease
from app.bus.redis import RedisBus
from app.errors import SessionBusy
from app.runs import RunManager, RunRequestOptions
from app.runs.handle import RunHandle
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import open_store
from app.telemetry.metrics import Metrics
from tests.support.services import REDIS_URL, drop_prefix, new_prefix
from tests.support.waiting import wait_until

pytestmark = pytest.mark.redis


class CountingBus(RedisBus):
    """The Redis bus, noting which start call each run made, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []
        acquire = self.locks.acquire

        async def counted(
            session_id: str, holder: str, ttl: float, *, exclusive: bool = False
        ) -> Lease | None:
            self.calls.append(("acquire", holder))
            return await acquire(session_id, holder, ttl, exclusive=exclusive)

        self.locks.acquire = counted  # type: ignore[method-assign]

    async def claim_run(self, run_id: str, *, session_id: str, ttl: float) -> Lease | None:
        self.calls.append(("claim_run", run_id))
        return await super().claim_run(run_id, session_id=session_id, ttl=ttl)

    async def open_run(self, run_id: str, *, session_id: str, fence: int) -> None:
        self.calls.append(("open_run", run_id))
        await super().open_run(run_id, session_id=session_id, fence=fence)

    def of(self, run_id: str) -> list[str]:
        return [name for name, run in self.calls if run == run_id]


@pytest.fixture
def prefix() -> Iterator[str]:
    value = new_prefix()
    yield value
    drop_prefix(value)


@pytest.fixture
async def world(tmp_path: Path, prefix: str) -> AsyncIterator[tuple[RunManager, CountingBus]]:
    # one slot, so a second run waits for it
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/a.db", demo_token_delay=0.02, redis_url=None
    )
    store = await open_store(settings.database_url)
    bus = CountingBus(REDIS_URL, prefix=prefix, lease_seconds=5.0)
    await bus.start()
    agent = await build_agent(settings, load_config(None))
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=1, max_queued=4),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=10,
        lease_seconds=5,
    )
    try:
        yield manager, bus
    finally:
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


def options(**values: Any) -> RunRequestOptions:
    return RunRequestOptions(input="hello there", **values)


async def ended(manager: RunManager, handle: RunHandle) -> None:
    await handle.finished
    assert handle.status == "completed"


async def test_a_run_with_a_slot_takes_its_lease_with_its_log(
    world: tuple[RunManager, CountingBus],
) -> None:
    manager, bus = world
    handle = await manager.start("anonymous", "s1", options())
    assert bus.of(handle.run_id) == ["claim_run"]
    assert await bus.locks.holder("s1") == handle.run_id
    assert await bus.events.exists(handle.run_id)
    # a start in the busy session: refused, and nothing of it is opened
    with pytest.raises(SessionBusy) as refused:
        await manager.start("anonymous", "s1", options())
    assert refused.value.extra == {"active_run_id": handle.run_id}
    [(_, other)] = [call for call in bus.calls if call[1] != handle.run_id]
    assert not await bus.events.exists(other)
    assert bus.stats()["locks"] == 1 and bus.stats()["routed_runs"] == 1
    await ended(manager, handle)
    assert await bus.locks.holder("s1") is None
    assert bus.stats()["locks"] == 0 and bus.stats()["routed_runs"] == 0


async def test_a_run_that_waits_for_a_slot_holds_its_session_before_its_log(
    world: tuple[RunManager, CountingBus],
) -> None:
    manager, bus = world
    first = await manager.start("anonymous", "s1", options())
    starting = asyncio.ensure_future(manager.start("anonymous", "s2", options()))
    await wait_until(lambda: any(run != first.run_id for _, run in bus.calls))
    [(_, second)] = [call for call in bus.calls if call[1] != first.run_id]
    assert bus.of(second) == ["acquire"]
    # queued: its session is held (a start there gets its 409 now), its log not opened yet
    assert await bus.locks.holder("s2") == second
    assert not await bus.events.exists(second)
    # a background run with no slot yet is recorded (queued) and its log opened before it
    # waits: its lease comes with its log
    background = await manager.start("anonymous", "s3", options(background=True))
    assert bus.of(background.run_id) == ["claim_run"]
    assert background.status == "queued"
    await ended(manager, first)
    handle = await starting
    assert bus.of(second) == ["acquire", "open_run"]
    await ended(manager, handle)
    await ended(manager, background)


async def test_a_run_that_replaces_a_turn_takes_its_lease_first(
    world: tuple[RunManager, CountingBus],
) -> None:
    manager, bus = world
    first = await manager.start("anonymous", "s1", options())
    await ended(manager, first)
    again = await manager.start("anonymous", "s1", options(replaces=first.run_id))
    # the turn it replaces is removed under the lease, before the run's log opens
    assert bus.of(again.run_id) == ["acquire", "open_run"]
    await ended(manager, again)
