"""Starting a run: its record is written while the run starts, and every way that write can
end (stored, failed, the request gone meanwhile) leaves the run ended and nothing held."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.agents.build import load_config
from app.bus import LocalBus
from app.errors import NotFound
from app.runs import RunManager, RunRequestOptions
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import RunRecord, StorageUnavailable, Store, open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until


class HeldStore:
    """A real store whose ``create_run`` waits for the test's word, or fails."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.fail: BaseException | None = None
        self.records: list[RunRecord] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def create_run(self, run: RunRecord, **options: Any) -> None:
        self.records.append(run)
        self.entered.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        await self._store.create_run(run, **options)


class World:
    def __init__(self, manager: RunManager, store: HeldStore, bus: LocalBus) -> None:
        self.manager = manager
        self.store = store
        self.bus = bus

    def start(self, session_id: str = "s1") -> asyncio.Task[Any]:
        options = RunRequestOptions(input="hello there")
        return asyncio.ensure_future(self.manager.start("anonymous", session_id, options))

    async def logged(self, run_id: str) -> int:
        return await self.bus.events.last_seq(run_id) or 0

    async def idle(self) -> None:
        async def settled() -> bool:
            state = self.manager.debug_state()
            return bool(state["runs"] == 0 and state["tasks"] == 0)

        await wait_until(settled)
        state = self.manager.debug_state()
        assert state["admission_running"] == 0
        assert state["admission_queued"] == 0
        assert state["agent_active_runs"] == 0
        assert state["agent_active_sessions"] == 0


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/a.db", demo_token_delay=0.0, redis_url=None
    )
    real = await open_store(settings.database_url)
    store = HeldStore(real)
    bus = LocalBus()
    agent = await build_agent(settings, load_config(None))
    manager = run_manager(agent, store, bus)
    try:
        yield World(manager, store, bus)
    finally:
        store.release.set()
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await real.close()


async def test_the_run_starts_while_its_record_is_written(world: World) -> None:
    starting = world.start()
    await world.store.entered.wait()
    run_id = world.store.records[0].run_id

    async def under_way() -> bool:
        return await world.logged(run_id) >= 2  # run.started and the first text

    await wait_until(under_way)
    assert not starting.done()  # the caller learns the run's id only once it is stored
    world.store.release.set()
    handle = await starting
    await handle.finished
    record = await world.store.get_run(run_id)
    assert record is not None and record.status == "completed"
    await world.idle()


@pytest.mark.parametrize(
    "failure",
    [StorageUnavailable("the disk is gone"), NotFound("no session")],
    ids=["store-down", "session-deleted"],
)
async def test_a_record_that_cannot_be_written_ends_the_started_run(
    world: World, failure: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    world.store.fail = failure
    starting = world.start()
    await world.store.entered.wait()
    run_id = world.store.records[0].run_id
    world.store.release.set()
    with pytest.raises(type(failure)):
        await starting
    await world.idle()
    assert await world.store.get_run(run_id) is None
    # the run stored nothing after its record failed, so nothing complained about it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # and the session is free again
    world.store.fail = None
    handle = await world.start()
    await handle.finished
    assert handle.status == "completed"


async def test_a_request_gone_while_the_record_is_written_cancels_the_run(world: World) -> None:
    starting = world.start()
    await world.store.entered.wait()
    run_id = world.store.records[0].run_id
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    world.store.release.set()
    await world.idle()
    record = await world.store.get_run(run_id)
    assert record is not None and record.status == "cancelled"
    assert record.error is None
