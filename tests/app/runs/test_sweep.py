"""With a shared bus, a run whose worker died (its lease lapsed) is failed as ``worker_lost``
by whichever worker notices, and its log's readers get that terminal event."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.agents.build import load_config
from app.bus import LocalBus
from app.bus.wire import WireEncoder
from app.errors import SessionBusy
from app.runs import RunManager, RunRequestOptions
from app.server.lifespan import build_agent
from app.settings import Settings
from app.storage import RunRecord, Store, open_store
from app.webhooks.delivery import WebhookSecrets
from app.webhooks.hooks import RunWebhooks
from app.webhooks.targets import WebhookTargets
from tests.support.managers import check_lost_run_ended, orphan, run_manager
from tests.support.waiting import wait_until


class SharedBus(LocalBus):
    """The in-process bus, claiming to be shared: what the reaper sees with Redis."""

    shared = True


World = tuple[RunManager, Store, SharedBus]


@contextlib.asynccontextmanager
async def open_world(tmp_path: Path, **options: Any) -> AsyncIterator[World]:
    """A worker's manager on a shared bus (``options``: more of ``RunManager``'s keywords)."""
    settings = Settings(database_url=f"sqlite:///{tmp_path}/a.db", lease_seconds=30)
    store = await open_store(settings.database_url)
    bus = SharedBus()
    agent = await build_agent(settings, load_config(None))
    manager = run_manager(agent, store, bus, **options)
    try:
        yield manager, store, bus
    finally:
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(tmp_path) as opened:
        yield opened


async def test_a_lost_run_is_failed_and_its_readers_told(
    world: World,
) -> None:
    manager, store, bus = world
    await orphan(store, bus, "run_dead", "s-dead")
    await orphan(store, bus, "run_alive", "s-alive")
    alive = await bus.locks.acquire("s-alive", "run_alive", 30)  # its worker still renews
    assert alive is not None
    reader = await bus.events.subscribe("run_dead", after=2)
    waiting = asyncio.ensure_future(reader.next())
    assert await manager.reap_lost_runs() == 1
    (terminal,) = await waiting
    assert terminal.seq == 3
    assert terminal.document["data"]["error"]["code"] == "worker_lost"
    assert reader.finished
    await reader.aclose()
    await check_lost_run_ended(manager, store, bus)


@pytest.mark.parametrize("log", ["kept", "expiring while read"])
async def test_a_run_that_ended_after_the_sweep_listed_it_is_left_alone(
    world: World, monkeypatch: pytest.MonkeyPatch, log: str
) -> None:
    # The sweep lists the store's unfinished runs, then visits them one by one; a run that
    # ended normally meanwhile has released its lock. Taking that lock to "settle" it would
    # make its client's next run in the session find the session busy. Its sealed log may
    # also reach its TTL just as the sweep reads it (found, then gone): still nothing to do.
    manager, store, bus = world
    await orphan(store, bus, "run_done", "s-done")
    listed = await store.list_unfinished_runs()
    await store.update_run("run_done", status="completed", output={"content": "ab"})
    end = WireEncoder("run_done", "s-done").encode(3, "run.completed", 0.0, {"output": {}})
    await bus.events.append("run_done", end, fence=1)

    async def stale() -> list[RunRecord]:
        return listed

    if log == "expiring while read":
        subscribe = bus.events.subscribe

        async def expired_first(run_id: str, after: int = 0) -> Any:
            bus.events._expire(run_id)  # its TTL passes between two reads of the sweep
            return await subscribe(run_id, after)

        monkeypatch.setattr(bus.events, "subscribe", expired_first)

    taken: list[str] = []
    acquire = bus.locks.acquire

    async def recording_acquire(session_id: str, holder: str, ttl: float) -> Any:
        taken.append(holder)
        return await acquire(session_id, holder, ttl)

    monkeypatch.setattr(store, "list_unfinished_runs", stale)
    monkeypatch.setattr(bus.locks, "acquire", recording_acquire)
    assert await manager.reap_lost_runs() == 0
    assert taken == []
    done = await store.get_run("run_done")
    assert done is not None and done.status == "completed"


async def test_a_session_held_by_the_sweep_names_no_active_run(
    world: World,
) -> None:
    manager, _, bus = world
    lease = await bus.locks.acquire("s-swept", "reaper_0123", 30)
    assert lease is not None
    with pytest.raises(SessionBusy) as refused:
        await manager.start("anonymous", "s-swept", RunRequestOptions(input="hi"))
    assert refused.value.extra["active_run_id"] is None
    await bus.locks.release(lease)


async def test_the_sweep_passes_over_this_workers_own_runs_without_a_look(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run waiting for a confirmation here is unfinished in the store, so the sweep lists it;
    # it ends (here) while the listing is read. Its worker ends it properly: the sweep must
    # neither read its lock, record or log nor take its session.
    manager, store, bus = world
    handle = await manager.start(
        "anonymous", "s-mine", RunRequestOptions(input="delete file-1.txt", background=True)
    )

    async def waiting() -> bool:
        record = await store.get_run(handle.run_id)
        return record is not None and record.status == "waiting"

    await wait_until(waiting)
    list_unfinished = store.list_unfinished_runs

    async def ending_meanwhile() -> list[RunRecord]:
        listed = await list_unfinished()
        assert [record.run_id for record in listed] == [handle.run_id]
        assert manager.cancel_local(handle.run_id, "cancel_requested")
        await handle.finished
        return listed

    looked: list[str] = []
    holder = bus.locks.holder

    async def recording_holder(session_id: str) -> str | None:
        looked.append(session_id)
        return await holder(session_id)

    monkeypatch.setattr(store, "list_unfinished_runs", ending_meanwhile)
    monkeypatch.setattr(bus.locks, "holder", recording_holder)
    assert await manager.reap_lost_runs() == 0
    assert looked == []
    assert await holder("s-mine") is None
    record = await store.get_run(handle.run_id)
    assert record is not None and record.status == "cancelled"


HOOK = "https://hooks.example/runs"


@pytest.fixture
async def hooked(tmp_path: Path) -> AsyncIterator[World]:
    """A manager whose runs have webhooks (no sender: messages stay in the store's outbox)."""
    webhooks = RunWebhooks(WebhookTargets(allow_private=True), WebhookSecrets(default=b"k" * 32))
    async with open_world(tmp_path, webhooks=webhooks) as opened:
        yield opened


async def _sent(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The bodies of the run's notifications, as queued in the outbox."""
    return [json.loads(state.message.body) for state in await store.webhook_states(run_id)]


async def test_a_lost_run_notifies_its_webhook_of_its_end(
    hooked: World,
) -> None:
    manager, store, bus = hooked
    await orphan(store, bus, "run_dead", "s-dead", webhook_url=HOOK)
    await orphan(store, bus, "run_quiet", "s-quiet")  # started without a webhook
    assert await manager.reap_lost_runs() == 2
    (body,) = await _sent(store, "run_dead")
    assert body["type"] == "run.failed"
    assert body["data"]["run_id"] == "run_dead" and body["data"]["status"] == "failed"
    assert body["data"]["error"]["code"] == "worker_lost"
    assert await _sent(store, "run_quiet") == []


async def test_a_run_that_logged_its_end_but_did_not_store_it_notifies_that_end(
    hooked: World,
) -> None:
    # its worker appended run.completed and died before the store write that carries the
    # notification: the sweep stores the logged end, and sends what the worker would have
    manager, store, bus = hooked
    await orphan(store, bus, "run_done", "s-done", webhook_url=HOOK)
    output = {"content": "ab"}
    data = {"output": output, "usage": {"input_tokens": 1, "output_tokens": 2}}
    end = WireEncoder("run_done", "s-done").encode(3, "run.completed", 0.0, data)
    await bus.events.append("run_done", end, fence=1)
    assert await manager.reap_lost_runs() == 0  # not lost: it ended
    record = await store.get_run("run_done")
    assert record is not None and record.status == "completed" and record.output == output
    (body,) = await _sent(store, "run_done")
    assert body["type"] == "run.completed"
    assert body["data"]["output"] == output and body["data"]["status"] == "completed"
