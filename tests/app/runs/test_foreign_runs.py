"""Another principal's live run is answered like an unknown id, at the same cost: the store
queries its lookups make are the same, so the answer's timing cannot tell that the run exists."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.extensions.external import ExternalEvent
from app.agents.build import load_config
from app.bus import LocalBus
from app.errors import NotFound
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import Store, open_store
from tests.support.managers import run_manager
from tests.support.waiting import wait_until


async def asked_call(bus: LocalBus, handle: RunHandle) -> str:
    """The id of the tool call the waiting run asks a confirmation for (from its log)."""
    subscription = await bus.events.subscribe(handle.run_id)
    try:
        logged = await subscription.next()
    finally:
        await subscription.aclose()
    (asked,) = [e for e in logged if e.type == "custom"]
    return str(asked.document["data"]["payload"]["tool_call_id"])


class CountingStore:
    """A real store that counts the calls made to it, by method."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attribute(*args, **kwargs)

        return counted


@pytest.fixture
async def bus() -> AsyncIterator[LocalBus]:
    local = LocalBus()
    yield local
    await local.aclose()


@pytest.fixture
async def world(tmp_path: Path, bus: LocalBus) -> AsyncIterator[tuple[RunManager, CountingStore]]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/a.db", demo_token_delay=0.0, redis_url=None
    )
    real = await open_store(settings.database_url)
    store = CountingStore(real)
    agent = await build_agent(settings, load_config(None))
    manager = run_manager(agent, store, bus)
    try:
        yield manager, store
    finally:
        await manager.aclose()
        await agent.aclose()
        await real.close()


async def test_a_foreign_live_run_costs_what_an_unknown_id_costs(
    world: tuple[RunManager, CountingStore],
) -> None:
    manager, store = world
    # alice's run waits for a confirmation: it stays live, held by this worker
    handle = await manager.start("alice", "s-alice", RunRequestOptions(input="delete x.txt"))
    await wait_until(lambda: manager.live_status(handle) == "waiting")

    async def queries(principal: str, run_id: str) -> collections.Counter[str]:
        store.calls.clear()
        assert await manager.find(run_id, principal) is None
        with pytest.raises(NotFound):
            await manager.routing.external_event(
                principal, "s-alice", run_id, ExternalEvent("confirmation", {})
            )
        # the lookups' own reads (the run writes its own status meanwhile)
        return collections.Counter({k: store.calls[k] for k in ("get_run", "get_session")})

    foreign = await queries("bob", handle.run_id)
    unknown = await queries("bob", "run_0123456789abcdef0123456789abcdef")
    assert foreign == unknown, (foreign, unknown)
    # the run is resolved with its owner and session in one read (RunContext.find), by the
    # route's find and by the answer's own
    assert foreign["get_run"] == 2 and foreign["get_session"] == 0
    # alice herself is answered from the handle, without a query
    store.calls.clear()
    assert await manager.find(handle.run_id, "alice") is handle
    assert store.calls["get_run"] == 0
    await manager.cancel(handle.run_id, "alice")
    await handle.finished


async def test_an_answer_naming_another_s_run_under_ones_own_session_changes_nothing(
    world: tuple[RunManager, CountingStore], bus: LocalBus
) -> None:
    manager, _ = world
    handle = await manager.start("alice", "s-alice", RunRequestOptions(input="delete x.txt"))
    await wait_until(lambda: manager.live_status(handle) == "waiting")
    mine = await manager.start("bob", "s-bob", RunRequestOptions(input="hello"))
    await mine.finished
    approve = {"tool_call_id": await asked_call(bus, handle), "approved": True}
    token = handle.lease.token
    # bob names alice's run under his own session, and under hers; alice names her run under
    # another session of her own: the run is unknown to each of those, and untouched
    attempts = [("bob", "s-bob"), ("bob", "s-alice"), ("alice", "s-bob")]
    for principal, session in attempts:
        with pytest.raises(NotFound):
            await manager.routing.external_event(
                principal, session, handle.run_id, ExternalEvent("confirmation_response", approve)
            )
        assert await manager.cancel(handle.run_id, "bob") is None
        assert manager.live_status(handle) == "waiting"
        # still held here, under its own lease: nothing resumed it elsewhere or fenced it
        assert manager.local(handle.run_id) is handle and not handle.done
        assert handle.lease.token == token and handle.lease.session_id == "s-alice"
    # alice's own answer, under her own session, is the one taken
    deny = {**approve, "approved": False}
    taken = await manager.routing.external_event(
        "alice", "s-alice", handle.run_id, ExternalEvent("confirmation_response", deny)
    )
    assert taken == ["ConfirmationExtension"]
    await handle.finished
    assert handle.status == "completed"
    assert "did not delete" in str(handle.output)
