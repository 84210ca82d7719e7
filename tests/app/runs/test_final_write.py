"""A run's final write through a store that cannot be reached: kept, retried, never stale.

The store is real SQLite behind a switch: while ``down``, every call answers
``StorageUnavailable``, as PostgreSQL's store does when the database is out of reach. The run
waits in a tool call while the test cuts the store, so it ends during the outage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import AgentCore
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.bus import LocalBus
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.storage import StorageUnavailable, Store, open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until


class SwitchedStore:
    """A real store that answers ``StorageUnavailable`` while ``down``; it records the fence
    of every write that reached the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False
        self.landed: list[tuple[str, str, int | None]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method) or name == "close":
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StorageUnavailable("PostgreSQL at test:5432 is unavailable: refused")
            result = await method(*args, **kwargs)
            fence = kwargs.get("fence")
            if name == "end_run":  # the turn (if any) and the outcome, in one write
                if kwargs.get("messages"):
                    self.landed.append(("append_messages", str(args[0]), fence))
                self.landed.append(("update_run", str(args[0]), fence))
            elif name in ("append_messages", "update_run"):
                run_id = args[0] if name == "update_run" else args[1]
                self.landed.append((name, str(run_id), fence))
            return result

        return call


@dataclass
class World:
    manager: RunManager
    store: SwitchedStore
    bus: LocalBus
    release: asyncio.Event
    calls: list[str]

    async def ended_in_outage(self, session_id: str = "s") -> RunHandle:
        """A run that completes while the store is down (its record stored before)."""
        self.release.clear()
        calls = len(self.calls)
        handle = await self.manager.start(
            "anonymous", session_id, RunRequestOptions(input="go", background=True)
        )
        await wait_until(lambda: len(self.calls) > calls)
        self.store.down = True
        self.release.set()
        await asyncio.wait_for(asyncio.shield(handle.finished), 10)
        assert handle.status == "completed"  # what its readers were told
        return handle

    async def status(self, run_id: str) -> str | None:
        record = await self.store.store.get_run(run_id)
        return None if record is None else record.status

    async def turn_of(self, session_id: str) -> list[str]:
        return [m.run_id for m in await self.store.store.list_messages(session_id)]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    real = await open_store(f"sqlite:///{tmp_path}/a.db")
    store = SwitchedStore(real)
    bus = LocalBus()
    release = asyncio.Event()
    calls: list[str] = []

    @tool
    async def wait_here() -> str:
        """Wait until the test lets go."""
        calls.append("called")
        await release.wait()
        return "done"

    # each run (one at a time) calls the tool once, then answers
    agent = AgentCore(
        ScriptedModel([tool_call_turn("wait_here", {}), "answered"] * 10), tools=[wait_here]
    )
    manager = run_manager(agent, store, bus)
    try:
        yield World(manager, store, bus, release, calls)
    finally:
        store.down = False
        release.set()
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await real.close()


async def test_the_end_is_stored_once_the_store_is_back(world: World) -> None:
    handle = await world.ended_in_outage()
    assert await world.status(handle.run_id) == "running"
    assert world.manager.unwritten_ends == 1
    # on one worker its session stays locked until its end is stored
    assert await world.bus.locks.holder("s") == handle.run_id
    world.store.down = False
    await wait_until(lambda: world.manager.unwritten_ends == 0)
    assert await world.status(handle.run_id) == "completed"
    assert set(await world.turn_of("s")) == {handle.run_id}
    assert await world.bus.locks.holder("s") is None
    record = await world.store.store.get_run(handle.run_id)
    assert record is not None and record.usage is not None


async def test_the_next_start_stores_the_end_first(world: World) -> None:
    first = await world.ended_in_outage()
    world.store.down = False
    second = await world.manager.start(
        "anonymous", "s", RunRequestOptions(input="next", background=True)
    )
    assert await world.status(first.run_id) == "completed"
    world.release.set()
    await asyncio.wait_for(asyncio.shield(second.finished), 10)
    turns = await world.turn_of("s")
    assert turns == sorted(turns, key=lambda run_id: run_id != first.run_id)
    assert set(turns) == {first.run_id, second.run_id}


async def test_a_newer_token_in_the_store_ends_the_retry(world: World) -> None:
    handle = await world.ended_in_outage()
    token = handle.lease.token
    # meanwhile another worker's sweep took the run over and failed it with a newer token
    await world.store.store.update_run(
        handle.run_id,
        status="failed",
        error={"code": "worker_lost", "message": "lost"},
        fence=token + 1,
    )
    world.store.down = False
    await wait_until(lambda: world.manager.unwritten_ends == 0)
    assert await world.status(handle.run_id) == "failed"
    assert await world.turn_of("s") == []
    assert not [w for w in world.store.landed if w[1] == handle.run_id and w[0] != "update_run"]
    assert all(fence == token for _, run, fence in world.store.landed if run == handle.run_id)
    record = await world.store.store.get_run(handle.run_id)
    assert record is not None and record.error == {"code": "worker_lost", "message": "lost"}


async def test_another_holder_of_the_lock_ends_the_retry(world: World) -> None:
    handle = await world.ended_in_outage()
    landed = len(world.store.landed)
    await world.bus.locks.release(handle.lease)
    other = await world.bus.locks.acquire("s", f"run_{'1' * 32}", 30.0)
    assert other is not None and other.token > handle.lease.token
    world.store.down = False
    await wait_until(lambda: world.manager.unwritten_ends == 0)
    # nothing was written with the stale token
    assert world.store.landed[landed:] == []
    assert await world.status(handle.run_id) == "running"
    assert await world.bus.locks.holder("s") == other.holder
    await world.bus.locks.release(other)


async def test_the_drain_retries_then_logs_what_it_could_not_store(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    handle = await world.ended_in_outage()
    with caplog.at_level(logging.ERROR, logger="app.runs"):
        await world.manager.drain(0.3)
        await world.manager.aclose()
    assert world.manager.unwritten_ends == 0
    logged = [r for r in caplog.records if getattr(r, "run_id", None) == handle.run_id]
    assert any("could not store the end of a run" in r.getMessage() for r in logged)
    assert any(handle.run_id in getattr(r, "runs", []) for r in caplog.records)
    world.store.down = False
    assert await world.status(handle.run_id) == "running"  # the next start's sweep fails it
