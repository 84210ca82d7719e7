"""A start that loses the session's lock to a run ending at that very moment is not a 409
naming no run: it tries once more and starts. A start that finds the lock held by a run whose
end is stored waits (``ENDING_WAIT``) for its terminal event to give the lock back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.agents.build import load_config
from app.bus import Lease, LocalBus
from app.bus.local import LocalSessionLocks
from app.errors import SessionBusy
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.runs import start as start_module
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until


class RacedLocks(LocalSessionLocks):
    """Session locks whose first ``acquire`` (or first ``races``) sees the lock held by a
    holder that lets go before ``holder`` is asked: the previous run ending between the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.races = 1
        self.raced = 0
        self.raced_calls = 0  # every acquire

    async def acquire(
        self, session_id: str, holder: str, ttl: float, *, exclusive: bool = False
    ) -> Lease | None:
        self.raced_calls += 1
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


# --- a holder whose end is stored, its terminal event (and the lock's release) on the way ----


async def _ended_holding_its_lock(manager: RunManager, bus: RacedBus) -> tuple[RunHandle, Lease]:
    """A run ended and stored (a client polling it reads it ended) whose lock is still held,
    as if its terminal event had not given it back yet."""
    bus.raced.races = 0
    first = await manager.start("anonymous", "s1", RunRequestOptions(input="hello"))
    await first.finished
    assert first.status == "completed"
    held = await bus.locks.acquire("s1", first.run_id, 30.0)
    assert held is not None
    return first, held


async def test_a_start_waits_for_the_lock_of_a_run_whose_end_is_stored(
    world: tuple[RunManager, RacedBus], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, bus = world
    monkeypatch.setattr(start_module, "ENDING_WAIT", 60.0)
    _, held = await _ended_holding_its_lock(manager, bus)
    calls = bus.raced.raced_calls
    starting = asyncio.create_task(manager.start("anonymous", "s1", RunRequestOptions(input="hi")))
    # found it held, then asked again after a pause: waiting for it
    await wait_until(lambda: bus.raced.raced_calls >= calls + 2)
    assert not starting.done()
    await bus.locks.release(held)
    async with asyncio.timeout(10):
        second = await starting
        await second.finished
    assert second.status == "completed"


async def test_the_wait_ends_in_session_busy_when_the_lock_stays(
    world: tuple[RunManager, RacedBus], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, bus = world
    monkeypatch.setattr(start_module, "ENDING_WAIT", 0.05)
    first, _ = await _ended_holding_its_lock(manager, bus)
    with pytest.raises(SessionBusy) as caught:
        await manager.start("anonymous", "s1", RunRequestOptions(input="hi"))
    assert caught.value.extra == {"active_run_id": first.run_id}


async def test_a_holder_still_running_is_session_busy_at_once(
    world: tuple[RunManager, RacedBus], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager, bus = world
    bus.raced.races = 0
    monkeypatch.setattr(start_module, "ENDING_WAIT", 60.0)  # a wait would time this test out
    assert await bus.locks.acquire("s1", "run_elsewhere", 30.0) is not None  # no stored end
    async with asyncio.timeout(10):
        with pytest.raises(SessionBusy) as caught:
            await manager.start("anonymous", "s1", RunRequestOptions(input="hi"))
    assert caught.value.extra == {"active_run_id": "run_elsewhere"}
