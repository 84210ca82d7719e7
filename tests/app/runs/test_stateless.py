"""Stateless sessions (a protocol call's own) on SQLite and PostgreSQL: never listed, and
deleted by the retention once idle, unless a run is going on in them or holds their lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.bus.local import LocalSessionLocks
from app.runs.stateless import StatelessReaper
from app.storage import RunRecord, Store
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    store_fixture,  # noqa: F401 - provides the fixture store
)


def _run(run_id: str, session_id: str, **kw: Any) -> RunRecord:
    return RunRecord(
        run_id=run_id, session_id=session_id, principal="alice", agent="default", input="hi", **kw
    )


def _later() -> datetime:
    """A cut-off every session stored so far was last updated before."""
    return datetime.now(UTC) + timedelta(seconds=5)


def _earlier() -> datetime:
    return datetime.now(UTC) - timedelta(hours=1)


async def test_stateless_sessions_are_never_listed(store: Store) -> None:
    await store.create_run(_run("run_1", "conversation"), create_session=True)
    await store.create_run(_run("run_2", "chat_1"), create_session=True, stateless=True)
    await store.get_or_create_session("mcp_1", "alice", stateless=True)

    listed = await store.list_sessions("alice", 10)
    assert [s.id for s in listed] == ["conversation"]
    assert not listed[0].stateless
    chat = await store.get_session("chat_1")
    assert chat is not None and chat.stateless and chat.title == "hi"
    mcp = await store.get_session("mcp_1")
    assert mcp is not None and mcp.stateless


async def test_the_flag_is_set_at_creation_only(store: Store) -> None:
    await store.get_or_create_session("conversation", "alice")
    # a later stateless call naming it does not take a conversation out of the list
    again = await store.get_or_create_session("conversation", "alice", stateless=True)
    assert not again.stateless
    await store.create_run(_run("run_1", "conversation"), create_session=True, stateless=True)
    assert [s.id for s in await store.list_sessions("alice", 10)] == ["conversation"]


async def test_idle_stateless_sessions_are_the_retentions_to_delete(store: Store) -> None:
    await store.create_run(_run("run_done", "idle"), create_session=True, stateless=True)
    await store.append_messages("idle", "run_done", [{"role": "user", "content": "hi"}])
    await store.update_run("run_done", status="completed")
    await store.create_run(_run("run_going", "busy"), create_session=True, stateless=True)
    await store.update_run("run_going", status="waiting")
    await store.create_run(_run("run_kept", "conversation"), create_session=True)
    await store.update_run("run_kept", status="completed")

    # not idle long enough: nothing to delete yet
    assert await store.idle_stateless_sessions(_earlier(), 10) == []
    assert not await store.delete_idle_stateless_session("idle", _earlier())
    # the session with a run waiting for an answer, and the conversation, are kept
    assert await store.idle_stateless_sessions(_later(), 10) == ["idle"]
    assert not await store.delete_idle_stateless_session("busy", _later())
    assert not await store.delete_idle_stateless_session("conversation", _later())

    assert await store.delete_idle_stateless_session("idle", _later())
    assert await store.get_session("idle") is None
    assert await store.get_run("run_done") is None
    assert await store.list_messages("idle") == []
    assert await store.get_session("busy") is not None
    assert await store.get_session("conversation") is not None

    await store.update_run("run_going", status="completed")
    assert await store.idle_stateless_sessions(_later(), 10) == ["busy"]


async def test_the_oldest_come_first_a_batch_at_a_time(store: Store) -> None:
    for index in range(5):
        await store.get_or_create_session(f"chat_{index}", "alice", stateless=True)
    assert await store.idle_stateless_sessions(_later(), 3) == ["chat_0", "chat_1", "chat_2"]


async def test_the_reaper_deletes_idle_sessions_but_not_a_locked_one(store: Store) -> None:
    locks = LocalSessionLocks()
    for session_id in ("chat_a", "chat_b", "chat_c"):
        await store.create_run(
            _run(f"run_{session_id}", session_id), create_session=True, stateless=True
        )
        await store.update_run(f"run_{session_id}", status="completed")
    await store.create_run(_run("run_kept", "conversation"), create_session=True)
    await store.update_run("run_kept", status="completed")
    # a run starting in chat_c right now holds its lock
    lease = await locks.acquire("chat_c", "run_next", 15.0)
    assert lease is not None

    now = datetime.now(UTC)
    reaper = StatelessReaper(store, locks, retention=60.0, clock=lambda: now)
    assert await reaper.sweep() == 0  # nothing idle for a minute yet

    now += timedelta(seconds=61)
    assert await reaper.sweep() == 2
    assert await store.get_session("chat_a") is None
    assert await store.get_session("chat_b") is None
    assert await store.get_session("chat_c") is not None
    assert await store.get_session("conversation") is not None
    assert await locks.holder("chat_a") is None  # the reaper's own lock is given back

    await locks.release(lease)
    assert await reaper.sweep() == 1
    assert await store.get_session("chat_c") is None
    assert reaper.interval == 15.0
