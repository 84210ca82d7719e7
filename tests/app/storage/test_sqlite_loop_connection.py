"""The SQLite store's short operations on the loop's own connection: they run there when the
thread is idle, never ahead of an operation submitted before them, never waiting for a lock
another process holds (the thread waits for it instead), and the WAL they grow is
checkpointed on the thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.storage import CheckpointRecord, SessionRecord, StorageUnavailable
from app.storage.sqlite.checkpoints import SHORT_CHECKPOINT
from app.storage.sqlite.loop_connection import CHECKPOINT_EVERY
from app.storage.sqlite.store import SQLiteStore
from tests.support.storage import running_run


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await SQLiteStore.connect(str(tmp_path / "agent.db"))
    try:
        yield opened
    finally:
        await opened.close()


class _ThreadJobs:
    """The names of the jobs the store hands its thread."""

    def __init__(self, store: SQLiteStore) -> None:
        self.names: list[str] = []
        submit = store._jobs.submit

        def counting(future: Any, name: str, function: Any, *args: Any) -> None:
            self.names.append(name)
            submit(future, name, function, *args)

        store._jobs.submit = counting  # type: ignore[method-assign]


async def test_a_runs_own_operations_run_on_the_loop(store: SQLiteStore) -> None:
    jobs = _ThreadJobs(store)
    before = store._on_loop.operations
    await store.create_run(running_run("run_a"), create_session=True)
    assert await store.get_session("s1") is not None
    await store.end_run(
        "run_a",
        session_id="s1",
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}],
        status="completed",
    )
    record = await store.get_run("run_a")
    assert record is not None and record.status == "completed"
    assert len(await store.list_messages("s1")) == 2  # a short conversation
    assert store._on_loop.operations - before == 5
    assert jobs.names == []
    # everything else still goes to the thread
    assert [session.id for session in await store.list_sessions("alice")] == ["s1"]
    assert jobs.names == ["_list_sessions"]


async def test_a_long_conversation_is_read_on_the_thread(store: SQLiteStore) -> None:
    await store.create_run(running_run("run_a"), create_session=True)
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}]
    await store.append_messages("s1", "run_a", turn * 32)  # 64 messages: still short
    jobs = _ThreadJobs(store)
    assert len(await store.list_messages("s1")) == 64
    assert jobs.names == []
    await store.create_run(running_run("run_b"), create_session=True)
    await store.append_messages("s1", "run_b", turn[:1])
    assert len(await store.list_messages("s1")) == 65
    assert jobs.names == ["insert_messages", "select_messages"]
    # and a few long messages are as long as many
    await store.create_run(running_run("run_c", "s2"), create_session=True)
    await store.append_messages("s2", "run_c", [{"role": "user", "content": "x" * 300_000}])
    assert len(await store.list_messages("s2")) == 1
    assert jobs.names[-1] == "select_messages"


async def test_a_small_checkpoint_is_written_on_the_loop_and_a_large_one_on_the_thread(
    store: SQLiteStore,
) -> None:
    await store.create_run(running_run("run_a"), create_session=True)
    jobs = _ThreadJobs(store)

    def checkpoint(step: int, text: str) -> CheckpointRecord:
        return CheckpointRecord(
            run_id="run_a",
            session_id="s1",
            step=step,
            event_seq=step,
            data={"messages": [text]},
            updated_at=datetime.now(UTC),
        )

    await store.save_checkpoint(checkpoint(1, "short"), fence=0)
    assert jobs.names == []
    await store.save_checkpoint(checkpoint(2, "x" * (SHORT_CHECKPOINT + 1)), fence=0)
    assert jobs.names == ["_save"]
    stored = await store.get_checkpoint("run_a")
    assert stored is not None and stored.step == 2
    assert len(stored.data["messages"][0]) == SHORT_CHECKPOINT + 1


async def test_a_short_operation_waits_for_the_operations_submitted_before_it(
    store: SQLiteStore,
) -> None:
    release = threading.Event()

    def slow_insert(db: sqlite3.Connection) -> None:
        release.wait(10)
        db.execute(
            "INSERT INTO sessions (id, principal, created_at, updated_at) VALUES (?, ?, ?, ?)",
            ("s9", "alice", "2026-01-01T00:00:00.000000+00:00", "2026-01-01T00:00:00.000000+00:00"),
        )

    jobs = _ThreadJobs(store)
    earlier = asyncio.ensure_future(store._write(slow_insert))
    await asyncio.sleep(0)
    read = asyncio.ensure_future(store.get_session("s9"))
    later = asyncio.ensure_future(store.list_sessions("alice"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not read.done() and not later.done()  # behind the thread's job, not beside it
    assert jobs.names == ["slow_insert"]  # the later one waits behind the short one
    release.set()
    await earlier
    found = await read
    assert isinstance(found, SessionRecord) and found.id == "s9"
    await later
    assert jobs.names == ["slow_insert", "_list_sessions"]


async def test_a_lock_held_by_another_process_is_waited_for_on_the_thread(
    store: SQLiteStore, tmp_path: Path
) -> None:
    other = sqlite3.connect(str(tmp_path / "agent.db"), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another worker's write transaction
    try:
        jobs = _ThreadJobs(store)
        before = store._on_loop.operations
        create = asyncio.ensure_future(store.create_run(running_run("run_a"), create_session=True))
        ticks = 0
        while ticks < 50:  # the loop goes on while the write waits for the lock
            await asyncio.sleep(0)
            ticks += 1
        assert not create.done()
        assert jobs.names == ["_create_run"]
        assert store._on_loop.operations == before
    finally:
        other.execute("COMMIT")
        other.close()
    await create
    assert (await store.get_run("run_a")) is not None


async def test_the_wal_written_on_the_loop_is_checkpointed(
    store: SQLiteStore, tmp_path: Path
) -> None:
    wal = tmp_path / "agent.db-wal"
    before = store._on_loop.checkpoints
    rounds = 6 * CHECKPOINT_EVERY
    for n in range(rounds):
        await store.create_run(running_run(f"run_{n}", f"s{n}"), create_session=True)
    assert store._on_loop.checkpoints - before == rounds // CHECKPOINT_EVERY
    # the checkpoints let the WAL start over: it holds a window's writes, not all of them
    sizes = wal.stat().st_size
    other = sqlite3.connect(str(tmp_path / "agent.db"))
    try:
        total_pages = other.execute("PRAGMA page_count").fetchone()[0]
        page_size = other.execute("PRAGMA page_size").fetchone()[0]
    finally:
        other.close()
    assert total_pages > 50
    assert sizes < rounds * 4 * page_size


async def test_an_in_memory_store_runs_everything_on_its_thread() -> None:
    store = await SQLiteStore.connect(":memory:")
    try:
        jobs = _ThreadJobs(store)
        await store.create_run(running_run("run_a"), create_session=True)
        assert await store.get_session("s1") is not None
        assert jobs.names == ["_create_run", "_get_session"]
        assert store._on_loop.operations == 0
    finally:
        await store.close()


async def test_a_closed_store_refuses_short_operations(tmp_path: Path) -> None:
    store = await SQLiteStore.connect(str(tmp_path / "agent.db"))
    await store.close()
    with pytest.raises(StorageUnavailable):
        await store.get_session("s1")
    with pytest.raises(StorageUnavailable):
        await store.create_run(running_run("run_a"), create_session=True)
