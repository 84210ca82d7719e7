"""A start that loses the session's lock to a run ending at that very moment is not a 409
naming no run: it tries once more and starts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.agents.build import load_config
from app.bus import Lease, LocalBus
from app.bus.local import LocalSessionLocks
from app.errors import SessionBusy
from app.runs import RunManager, RunRequestOptions
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import open_store
from tests.support.managers import run_manager


class RacedLocks(LocalSessionLocks):
    """Session locks whose first ``acquire`` (or first ``races``) sees the lock held by a
    holder that lets go before ``holder`` is asked: the previous run ending between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.races = 1
        self.raced = 0

    async def acquire(
        self, session_id: str, holder: str, ttl: float, *, exclusive: bool = False
    ) -> Lease | None:
        if self.raced < self.races:
            self.raced += 1
            return None
        return await super().acquire(session_id, holder, ttl)


class RacedBus(LocalBus):
    def __init__(self) -> None:
        super().__init__()
        self.raced = RacedLocks()
        self._locks = self.raced


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RunManager, RacedBus]]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/a.db", demo_token_delay=0.0, redis_url=None
    )
    store = await open_store(settings.database_url)
    bus = RacedBus()
    agent = await build_agent(settings, load_config(None))
    manager = run_manager(agent, store, bus)
    try:
        yield manager, bus
    finally:
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_a_lock_freed_between_acquire_and_holder_is_taken(
    world: tuple[RunManager, RacedBus],
) -> None:
    manager, bus = world
    handle = await manager.start("anonymous", "s1", RunRequestOptions(input="hello"))
    await handle.finished
    assert handle.status == "completed"
    assert bus.raced.raced == 1


async def test_a_lock_lost_twice_is_session_busy(world: tuple[RunManager, RacedBus]) -> None:
    manager, bus = world
    bus.raced.races = 2
    with pytest.raises(SessionBusy) as caught:
        await manager.start("anonymous", "s1", RunRequestOptions(input="hello"))
    assert caught.value.extra == {"active_run_id": None}
