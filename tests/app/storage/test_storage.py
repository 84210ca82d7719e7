"""The storage contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import sqlite3
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.storage import (
    PostgresStore,
    RunAlreadyExists,
    RunNotFound,
    RunRecord,
    SessionCursor,
    SessionNotFound,
    SessionOwnedByOther,
    SQLiteStore,
    StorageConfigError,
    StorageUnavailable,
    Store,
    UsageTotal,
    open_store,
    redact_url,
    sqlite_path,
)
from app.storage.base import TITLE_MAX_CHARS, title_of
from app.storage.postgres import store as pg_backend
from app.storage.sqlite import store as sqlite_backend
from tests.support.storage import (
    POSTGRES_URL,
    OpenStore,
    TcpProxy,
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    postgres_schema,
    store_fixture,  # noqa: F401 - provides the fixture store
    with_port,
    with_query,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _run(run_id: str, session_id: str = "s1", principal: str = "alice", **kw: Any) -> RunRecord:
    kw.setdefault("agent", "default")
    return RunRecord(
        run_id=run_id,
        session_id=session_id,
        principal=principal,
        input=f"input of {run_id}",
        **kw,
    )


def _messages(run: str, n: int) -> list[dict[str, Any]]:
    roles = ["user", "assistant", "tool"]
    return [{"role": roles[i % 3], "content": f"{run} #{i}"} for i in range(n)]


def _is_utc(value: datetime) -> bool:
    return value.utcoffset() == timedelta(0)


# --- sessions -----------------------------------------------------------------------------


async def test_session_is_created_once_and_owned(store: Store) -> None:
    assert await store.get_session("s1") is None

    created = await store.get_or_create_session("s1", "alice")
    assert (created.id, created.principal, created.message_count) == ("s1", "alice", 0)
    assert created.last_run_id is None
    assert _is_utc(created.created_at)
    assert created.updated_at == created.created_at

    again = await store.get_or_create_session("s1", "alice")
    assert again == created
    assert await store.get_session("s1") == created

    with pytest.raises(SessionOwnedByOther) as caught:
        await store.get_or_create_session("s1", "mallory")
    assert "alice" not in str(caught.value)
    assert await store.get_session("s1") == created


async def test_concurrent_first_use_creates_one_session(store: Store) -> None:
    records = await asyncio.gather(*(store.get_or_create_session("s1", "alice") for _ in range(10)))
    assert len({r.created_at for r in records}) == 1


async def _all_pages(store: Store, principal: str, limit: int) -> list[list[str]]:
    """Every page of the principal's sessions (their ids), following the cursor to the end."""
    pages: list[list[str]] = []
    before: SessionCursor | None = None
    while page := await store.list_sessions(principal, limit, before):
        pages.append([s.id for s in page])
        before = SessionCursor.after(page[-1])
    return pages


async def test_list_sessions_newest_first_and_only_the_principals(store: Store) -> None:
    for session_id in ("a1", "a2", "a3", "a4", "a5"):
        await store.get_or_create_session(session_id, "alice")
        await store.get_or_create_session(f"b-{session_id}", "bob")
    # a session moves to the front when a run adds to it
    await store.append_messages("a2", "r1", _messages("r1", 2))
    await store.append_messages("a4", "r2", _messages("r2", 1))

    listed = await store.list_sessions("alice", 100)
    assert [s.id for s in listed] == ["a4", "a2", "a5", "a3", "a1"]
    assert listed[0] == await store.get_session("a4")
    assert (listed[0].message_count, listed[0].last_run_id) == (1, "r2")
    assert [s.updated_at for s in listed] == sorted((s.updated_at for s in listed), reverse=True)
    assert all(s.principal == "alice" for s in listed)
    assert [s.id for s in await store.list_sessions("alice", 2)] == ["a4", "a2"]
    assert [s.id for s in await store.list_sessions("bob")][:1] == ["b-a5"]
    assert await store.list_sessions("mallory") == []

    assert await _all_pages(store, "alice", 2) == [["a4", "a2"], ["a5", "a3"], ["a1"]]
    assert await _all_pages(store, "alice", 5) == [["a4", "a2", "a5", "a3", "a1"]]
    after_a5 = SessionCursor.after(listed[2])
    assert [s.id for s in await store.list_sessions("alice", 10, after_a5)] == ["a3", "a1"]
    # a cursor names a place in the order, not a session: it outlives the session's deletion
    await store.delete_session("a5")
    assert [s.id for s in await store.list_sessions("alice", 10, after_a5)] == ["a3", "a1"]
    # and another principal's cursor only selects among the caller's own sessions
    assert all(s.principal == "bob" for s in await store.list_sessions("bob", 10, after_a5))
    with pytest.raises(ValueError, match="limit"):
        await store.list_sessions("alice", 0)


async def test_list_sessions_orders_ties_by_id(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every session created at one instant: the id alone decides, on both backends alike
    monkeypatch.setattr(sqlite_backend, "utcnow", lambda: T0)
    monkeypatch.setattr(pg_backend, "utcnow", lambda: T0)
    for session_id in ("t3", "t1", "t5", "t2", "t4"):
        await store.get_or_create_session(session_id, "alice")
    assert await _all_pages(store, "alice", 2) == [["t5", "t4"], ["t3", "t2"], ["t1"]]
    tie = SessionCursor(T0, "t3")
    assert [s.id for s in await store.list_sessions("alice", 10, tie)] == ["t2", "t1"]
    later = SessionCursor(T0 + timedelta(microseconds=1), "")
    assert [s.id for s in await store.list_sessions("alice", 10, later)] == [
        "t5",
        "t4",
        "t3",
        "t2",
        "t1",
    ]
    earlier = SessionCursor(T0 - timedelta(microseconds=1), "zzz")
    assert await store.list_sessions("alice", 10, earlier) == []


async def test_list_sessions_pages_stay_stable_while_sessions_are_added(store: Store) -> None:
    for i in range(6):
        await store.get_or_create_session(f"old-{i}", "alice")
    first = await store.list_sessions("alice", 3)
    assert [s.id for s in first] == ["old-5", "old-4", "old-3"]
    # new sessions, and an update of one on the first page, while the client reads page two
    await asyncio.gather(*(store.get_or_create_session(f"new-{i}", "alice") for i in range(5)))
    await store.append_messages("old-4", "r1", _messages("r1", 1))
    second = await store.list_sessions("alice", 3, SessionCursor.after(first[-1]))
    # exactly where the first page stopped: nothing repeated, nothing skipped
    assert [s.id for s in second] == ["old-2", "old-1", "old-0"]
    assert await store.list_sessions("alice", 3, SessionCursor.after(second[-1])) == []
    # a fresh first page shows the newcomers, the updated session first
    fresh = [s.id for s in await store.list_sessions("alice", 20)]
    assert fresh[0] == "old-4"
    assert sorted(fresh[1:6]) == [f"new-{i}" for i in range(5)]
    assert fresh[6:] == ["old-5", "old-3", "old-2", "old-1", "old-0"]


def test_session_cursor_validates() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        SessionCursor(datetime(2026, 1, 1), "s1")


# --- messages -----------------------------------------------------------------------------


async def test_messages_keep_their_order_across_runs(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    runs = {"r1": 2, "r2": 3, "r3": 1}
    for run_id, count in runs.items():
        await store.append_messages("s1", run_id, _messages(run_id, count))
    await store.append_messages("s1", "r4", [])  # changes nothing

    stored = await store.list_messages("s1")
    expected = [m for run_id, count in runs.items() for m in _messages(run_id, count)]
    assert [m.message for m in stored] == expected
    assert [m.position for m in stored] == list(range(6))
    assert [m.run_id for m in stored] == ["r1", "r1", "r2", "r2", "r2", "r3"]
    assert [m.role for m in stored] == [m["role"] for m in expected]
    assert all(m.session_id == "s1" and _is_utc(m.created_at) for m in stored)

    session = await store.get_session("s1")
    assert session is not None
    assert (session.message_count, session.last_run_id) == (6, "r3")
    assert session.updated_at > session.created_at
    assert await store.list_messages("unknown") == []


async def test_message_json_round_trips(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": 'héllo ✓ 日本 \n"quoted"'}],
        "tool_calls": [{"id": "c1", "arguments": {"n": 1, "x": 2.5, "ok": True, "none": None}}],
        "big": 2**53 + 1,
        "empty": {},
    }
    await store.append_messages("s1", "r1", [message])
    (stored,) = await store.list_messages("s1")
    assert stored.message == message


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"role": "assistant", "content": object()}, TypeError),
        ({"role": "assistant", "score": float("nan")}, ValueError),
        ({"content": "no role"}, ValueError),
    ],
    ids=["not-json", "nan", "no-role"],
)
async def test_failed_append_writes_nothing(
    store: Store, bad: dict[str, Any], error: type[Exception]
) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.append_messages("s1", "r1", _messages("r1", 2))
    before = await store.get_session("s1")

    # The bad message comes last, after the session row was updated inside the transaction:
    # only a real rollback leaves both the rows and the session untouched.
    with pytest.raises(error):
        await store.append_messages("s1", "r2", [*_messages("r2", 3), bad])

    assert [m.run_id for m in await store.list_messages("s1")] == ["r1", "r1"]
    assert await store.get_session("s1") == before
    await store.append_messages("s1", "r3", _messages("r3", 1))  # the store still works
    assert [m.position for m in await store.list_messages("s1")] == [0, 1, 2]


async def test_append_to_unknown_session_fails(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.append_messages("nope", "r1", _messages("r1", 1))


async def test_cancelled_callers_do_not_interrupt_writes(open_backend: OpenStore) -> None:
    store = await open_backend()
    await store.get_or_create_session("s1", "alice")
    # Cancel after a growing number of loop turns, to land at every await of the write.
    for turns in range(1, 25):
        task = asyncio.create_task(store.append_messages("s1", f"r{turns}", _messages("x", 3)))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await store.close()  # waits for the writes the cancelled callers started

    reopened = await open_backend()
    stored = await reopened.list_messages("s1")
    assert [m.position for m in stored] == list(range(24 * 3))
    # The writes overlapped (in any order on PostgreSQL), but no run's messages interleave.
    runs = [m.run_id for m in stored]
    assert runs == [run_id for run_id in runs[::3] for _ in range(3)]
    assert sorted(runs[::3]) == sorted(f"r{turns}" for turns in range(1, 25))
    session = await reopened.get_session("s1")
    assert session is not None
    assert session.message_count == 24 * 3
    with pytest.raises(StorageUnavailable, match="closed"):
        await store.get_session("s1")


async def test_concurrent_appends_to_one_session_do_not_collide(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await asyncio.gather(
        *(store.append_messages("s1", f"r{i}", _messages(f"r{i}", 3)) for i in range(8))
    )
    stored = await store.list_messages("s1")
    assert [m.position for m in stored] == list(range(24))
    # Each run's messages stay together.
    assert [stored[i].run_id for i in range(0, 24, 3)] == [
        stored[i].run_id for i in range(2, 24, 3)
    ]


# --- deletion -----------------------------------------------------------------------------


async def test_delete_removes_session_messages_and_runs(store: Store) -> None:
    for session_id in ("s1", "s2"):
        await store.get_or_create_session(session_id, "alice")
        await store.create_run(_run(f"{session_id}-run", session_id))
        await store.append_messages(session_id, f"{session_id}-run", _messages("m", 2))

    assert await store.delete_session("s1") is True
    assert await store.get_session("s1") is None
    assert await store.list_messages("s1") == []
    assert await store.get_run("s1-run") is None
    assert await store.list_runs("s1") == []
    assert await store.delete_session("s1") is False

    assert len(await store.list_messages("s2")) == 2
    assert await store.get_run("s2-run") is not None
    # The id is free again, for anyone.
    assert (await store.get_or_create_session("s1", "bob")).principal == "bob"


# --- runs ---------------------------------------------------------------------------------


async def test_run_lifecycle(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    run = _run("r1", created_at=T0, metadata={"client": "test", "n": [1, 2]})
    await store.create_run(run)
    assert await store.get_run("r1") == run
    assert await store.list_unfinished_runs() == [run]

    running = await store.update_run("r1", status="running")
    assert running.status == "running"
    assert running.started_at is not None
    assert _is_utc(running.started_at)
    assert running.finished_at is None

    waiting = await store.update_run("r1", status="waiting")
    assert waiting.started_at == running.started_at  # set once, on the first start

    output = {"content": "You said: hi"}
    usage = {"input_tokens": 3, "output_tokens": 4}
    done = await store.update_run("r1", status="completed", output=output, usage=usage)
    assert (done.status, done.output, done.usage, done.error) == ("completed", output, usage, None)
    assert done.finished_at is not None
    assert _is_utc(done.finished_at)
    assert done.finished_at >= running.started_at
    assert (done.input, done.metadata, done.created_at) == (run.input, run.metadata, T0)
    assert done.is_finished
    assert await store.get_run("r1") == done
    assert await store.list_unfinished_runs() == []

    # The first terminal status wins: a late update changes nothing and says so.
    late = await store.update_run(
        "r1", status="failed", error={"code": "worker_lost", "message": "lease expired"}
    )
    assert late == done


async def test_failed_run_keeps_error_and_explicit_times(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(_run("r1", created_at=T0))
    started, finished = T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)
    await store.update_run("r1", status="running", started_at=started)
    error = {"code": "run_timeout", "message": "run exceeded 300 s"}
    failed = await store.update_run("r1", status="failed", error=error, finished_at=finished)
    assert (failed.status, failed.error, failed.output) == ("failed", error, None)
    assert (failed.started_at, failed.finished_at) == (started, finished)


async def test_run_cancelled_while_queued_never_started(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(_run("r1"))
    cancelled = await store.update_run("r1", status="cancelled")
    assert cancelled.started_at is None
    assert cancelled.finished_at is not None


async def test_a_first_run_creates_its_session_in_the_same_write(store: Store) -> None:
    await store.create_run(_run("r1", "fresh"), create_session=True)
    session = await store.get_session("fresh")
    assert session is not None
    assert (session.principal, session.title) == ("alice", "input of r1")
    assert {run.run_id for run in await store.list_runs("fresh")} == {"r1"}
    # an existing session is used as it is; another's is refused, and nothing is written
    await store.create_run(_run("r2", "fresh"), create_session=True)
    with pytest.raises(SessionOwnedByOther):
        await store.create_run(_run("r3", "fresh", principal="mallory"), create_session=True)
    assert {run.run_id for run in await store.list_runs("fresh")} == {"r1", "r2"}
    with pytest.raises(RunAlreadyExists):
        await store.create_run(_run("r1", "other"), create_session=True)
    assert await store.get_session("other") is None  # rolled back with the run's insert


async def test_run_errors(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.create_run(_run("r1"))
    await store.get_or_create_session("s1", "alice")
    with pytest.raises(SessionOwnedByOther):
        await store.create_run(_run("r1", principal="mallory"))
    await store.create_run(_run("r1"))
    with pytest.raises(RunAlreadyExists):
        await store.create_run(_run("r1"))
    with pytest.raises(RunNotFound):
        await store.update_run("nope", status="running")
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.update_run("r1", status="completed", finished_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="unknown run status"):
        await store.update_run("r1", status="done")  # type: ignore[arg-type]
    assert await store.get_run("nope") is None


def test_run_record_validates() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        _run("r1", created_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="unknown run status"):
        _run("r1", status="done")
    assert _is_utc(_run("r1").created_at)


async def test_list_runs_newest_first(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.get_or_create_session("s2", "alice")
    for i in range(5):
        await store.create_run(_run(f"r{i}", created_at=T0 + timedelta(seconds=i)))
    await store.create_run(_run("other", "s2", created_at=T0 + timedelta(milliseconds=500)))
    await store.update_run("r1", status="completed")
    await store.update_run("r3", status="running")

    assert [r.run_id for r in await store.list_runs("s1", 3)] == ["r4", "r3", "r2"]
    assert [r.run_id for r in await store.list_runs("s1", 100)] == ["r4", "r3", "r2", "r1", "r0"]
    unfinished = [r.run_id for r in await store.list_unfinished_runs()]
    assert unfinished == ["r0", "other", "r2", "r3", "r4"]
    assert len(await store.list_runs("s1", None)) == 5
    with pytest.raises(ValueError, match="limit"):
        await store.list_runs("s1", 0)


async def test_a_run_records_the_model_that_answered(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(_run("r1"))
    assert (await store.update_run("r1", status="running")).model is None
    usage = {"input_tokens": 3, "output_tokens": 4, "model": "fallback-model"}
    done = await store.update_run("r1", status="completed", usage=usage, model="fallback-model")
    assert (done.model, done.usage) == ("fallback-model", usage)
    assert await store.get_run("r1") == done
    assert (await store.list_runs("s1"))[0].model == "fallback-model"


async def test_a_run_keeps_where_its_notifications_go(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(_run("r1", webhook_url="https://hooks.example/runs"))
    await store.create_run(_run("r2"))
    ended = await store.update_run("r1", status="failed", error={"code": "worker_lost"})
    assert ended.webhook_url == "https://hooks.example/runs"
    assert [r.webhook_url for r in await store.list_unfinished_runs()] == [None]
    assert (await store.get_run("r1")) == ended


# --- usage ---------------------------------------------------------------------------------


async def test_a_finished_run_books_its_usage_once_and_keeps_it_past_its_session(
    store: Store,
) -> None:
    day1, day2 = T0, T0 + timedelta(days=1)
    await store.get_or_create_session("s1", "alice")
    await store.get_or_create_session("s2", "bob")
    runs = [
        ("a1", "s1", "alice", "default", day1, {"input_tokens": 10, "output_tokens": 3}),
        ("a2", "s1", "alice", "research", day1, {"input_tokens": 20, "output_tokens": 4}),
        ("a3", "s1", "alice", "default", day2, {"input_tokens": 1, "output_tokens": 1}),
        ("b1", "s2", "bob", "default", day1, {"input_tokens": 100, "output_tokens": 50}),
    ]
    for run_id, session, principal, agent, finished, usage in runs:
        await store.create_run(_run(run_id, session, principal, agent=agent))
        await store.update_run(run_id, status="running")
        assert (
            await store.usage_totals(
                start=day1, end=day2 + timedelta(days=1), group_by="agent", principal=principal
            )
            is not None
        )
        await store.update_run(run_id, status="completed", usage=usage, finished_at=finished)
        # a finished run is final: a second end books nothing more
        await store.update_run(run_id, status="failed", usage=usage, finished_at=finished)
    # a run that ends without usage books nothing; an unfinished one neither
    await store.create_run(_run("a4", "s1", "alice"))
    await store.update_run("a4", status="failed", finished_at=day1)
    await store.create_run(_run("a5", "s1", "alice"))

    end = day2 + timedelta(days=1)
    assert await store.usage_totals(start=day1, end=end, group_by="agent", principal="alice") == [
        UsageTotal("default", 11, 4, 2),
        UsageTotal("research", 20, 4, 1),
    ]
    assert await store.usage_totals(start=day1, end=end, group_by="principal") == [
        UsageTotal("alice", 31, 8, 3),
        UsageTotal("bob", 100, 50, 1),
    ]
    assert await store.usage_totals(start=day1, end=end, group_by="day", principal="alice") == [
        UsageTotal(day1.date().isoformat(), 30, 7, 2),
        UsageTotal(day2.date().isoformat(), 1, 1, 1),
    ]
    # [start, end): the second day alone
    only_day2 = await store.usage_totals(
        start=day2, end=day2 + timedelta(days=1), group_by="principal"
    )
    assert only_day2 == [UsageTotal("alice", 1, 1, 1)]
    # deleting the session deletes its runs, not what they used
    assert await store.delete_session("s1")
    assert await store.usage_totals(
        start=day1, end=end, group_by="principal", principal="alice"
    ) == [UsageTotal("alice", 31, 8, 3)]
    assert await store.usage_totals(start=day1, end=end, group_by="agent", principal="carol") == []


async def test_the_usage_ledger_sums_the_cache_and_reasoning_counts_that_were_reported(
    store: Store,
) -> None:
    await store.get_or_create_session("s1", "alice")
    runs: list[tuple[str, str, dict[str, Any]]] = [
        # Anthropic-like: cache reads and writes, no reasoning count
        (
            "r1",
            "claude",
            {
                "input_tokens": 1000,
                "output_tokens": 10,
                "cached_input_tokens": 900,
                "cache_write_tokens": 50,
            },
        ),
        (
            "r2",
            "claude",
            {
                "input_tokens": 1100,
                "output_tokens": 20,
                "cached_input_tokens": 950,
                "cache_write_tokens": 0,
                "model": "claude-x",
            },
        ),
        # OpenAI-like: cache reads and reasoning
        (
            "r3",
            "o-series",
            {
                "input_tokens": 300,
                "output_tokens": 200,
                "cached_input_tokens": 0,
                "reasoning_tokens": 150,
            },
        ),
        # nothing reported beyond the two totals
        ("r4", "plain", {"input_tokens": 5, "output_tokens": 5}),
    ]
    for run_id, agent, usage in runs:
        await store.create_run(_run(run_id, agent=agent))
        await store.update_run(run_id, status="completed", usage=usage, finished_at=T0)

    day = timedelta(days=1)
    by_agent = await store.usage_totals(start=T0 - day, end=T0 + day, group_by="agent")
    assert by_agent == [
        UsageTotal("claude", 2100, 30, 2, cached_input_tokens=1850, cache_write_tokens=50),
        UsageTotal("o-series", 300, 200, 1, cached_input_tokens=0, reasoning_tokens=150),
        UsageTotal("plain", 5, 5, 1),
    ]
    # across groups, what some runs did not report is not counted as zero, nor made up
    (everyone,) = await store.usage_totals(start=T0 - day, end=T0 + day, group_by="principal")
    assert everyone == UsageTotal(
        "alice",
        2405,
        235,
        4,
        cached_input_tokens=1850,
        cache_write_tokens=50,
        reasoning_tokens=150,
    )


# --- titles and turns ---------------------------------------------------------------------


async def test_a_session_is_titled_by_its_first_input_until_renamed(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    assert (await store.get_session("s1")).title is None  # type: ignore[union-attr]
    await store.create_run(
        RunRecord(
            run_id="r1", session_id="s1", principal="alice", agent="a", input="  Plan\n a trip "
        )
    )
    await store.create_run(_run("r2"))
    session = await store.get_session("s1")
    assert session is not None and session.title == "Plan a trip"
    assert [s.title for s in await store.list_sessions("alice")] == ["Plan a trip"]

    renamed = await store.set_title("s1", "Holidays")
    assert renamed is not None and renamed.title == "Holidays"
    assert renamed.updated_at == session.updated_at  # a rename does not reorder the list
    await store.create_run(_run("r3"))
    assert (await store.get_session("s1")).title == "Holidays"  # type: ignore[union-attr]
    assert await store.set_title("nope", "x") is None


def test_title_of_an_input() -> None:
    assert title_of("  several\n\tlines  here ") == "several lines here"
    assert title_of(" \n ") is None
    long = title_of("word " * 100)
    assert long is not None and len(long) == TITLE_MAX_CHARS and long.endswith("…")


async def test_remove_last_turn(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.append_messages("s1", "r1", _messages("r1", 2))
    await store.append_messages("s1", "r2", _messages("r2", 3))
    # only the turn that ends the conversation can go
    assert not await store.remove_last_turn("s1", "r1")
    assert len(await store.list_messages("s1")) == 5
    assert await store.remove_last_turn("s1", "r2")
    session = await store.get_session("s1")
    assert session is not None and (session.message_count, session.last_run_id) == (2, "r1")
    assert [m.run_id for m in await store.list_messages("s1")] == ["r1", "r1"]
    # the next run appends after what is left
    await store.append_messages("s1", "r3", _messages("r3", 1))
    assert [m.position for m in await store.list_messages("s1")] == [0, 1, 2]
    # a run that stored nothing has nothing to remove
    assert await store.remove_last_turn("s1", "never-stored")
    assert await store.remove_last_turn("s1", "r3")
    assert await store.remove_last_turn("s1", "r1")
    session = await store.get_session("s1")
    assert session is not None and (session.message_count, session.last_run_id) == (0, None)
    assert await store.remove_last_turn("unknown-session", "r1")


# --- lifecycle ----------------------------------------------------------------------------


async def test_data_survives_close_and_reopen(open_backend: OpenStore) -> None:
    first = await open_backend()
    await first.get_or_create_session("s1", "alice")
    await first.create_run(_run("r1", created_at=T0))
    await first.append_messages("s1", "r1", _messages("r1", 2))
    await first.update_run("r1", status="completed", output={"content": "ok"})
    session, messages, run = (
        await first.get_session("s1"),
        await first.list_messages("s1"),
        await first.get_run("r1"),
    )
    await first.close()
    await first.close()  # idempotent

    second = await open_backend()
    assert await second.get_session("s1") == session
    assert await second.list_messages("s1") == messages
    assert await second.get_run("r1") == run


async def test_closed_store_is_unavailable(store: Store) -> None:
    await store.ping()
    await store.close()
    with pytest.raises(StorageUnavailable, match="closed"):
        await store.get_session("s1")
    with pytest.raises(StorageUnavailable):
        await store.ping()


async def test_many_stores_opening_at_once_migrate_once(open_backend: OpenStore) -> None:
    stores = await asyncio.gather(*(open_backend() for _ in range(8)))
    for s in stores:
        assert isinstance(s, SQLiteStore | PostgresStore)
        expected = (
            sqlite_backend.SCHEMA_VERSION
            if isinstance(s, SQLiteStore)
            else pg_backend.SCHEMA_VERSION
        )
        assert await s.migrate() == expected  # idempotent, and the schema is complete
    await stores[0].get_or_create_session("s1", "alice")
    assert await stores[7].get_session("s1") is not None


async def _execute(store: Store, statement: str) -> None:
    """Run SQL on the store's own connection (a test reaching behind the protocol)."""
    if isinstance(store, SQLiteStore):
        await store._write(lambda db: db.execute(statement))
    else:
        assert isinstance(store, PostgresStore)
        async with store._connection() as conn:
            await conn.execute(statement)


async def _index_names(store: Store) -> set[str]:
    if isinstance(store, SQLiteStore):
        rows = await store._read(lambda db: db.execute("PRAGMA index_list(sessions)").fetchall())
        return {row["name"] for row in rows}
    assert isinstance(store, PostgresStore)
    async with store._connection() as conn:
        rows = await conn.fetch(
            "SELECT indexname FROM pg_indexes"
            " WHERE tablename = 'sessions' AND schemaname = current_schema()"
        )
    return {row["indexname"] for row in rows}


@pytest.mark.parametrize("index_built_beforehand", [False, True], ids=["plain", "prebuilt"])
async def test_a_database_at_schema_1_is_upgraded_by_workers_starting_together(
    open_backend: OpenStore, index_built_beforehand: bool
) -> None:
    old = await open_backend()
    assert "sessions_by_principal" in await _index_names(old)
    await old.get_or_create_session("s1", "alice")
    await old.create_run(_run("r-before"))
    usage = {"input_tokens": 7, "output_tokens": 5}
    await old.update_run("r-before", status="completed", usage=usage, finished_at=T0)
    # back to what the first release left: schema 1, without the sessions' index (unless an
    # operator built it beforehand, as docs/deploy.md suggests for a large table)
    if not index_built_beforehand:
        await _execute(old, "DROP INDEX sessions_by_principal")
    await _execute(old, "ALTER TABLE sessions DROP COLUMN title")
    await _execute(old, "ALTER TABLE runs DROP COLUMN model")
    await _execute(old, "DROP TABLE usage")
    await _execute(old, "ALTER TABLE runs DROP COLUMN fence")
    await _execute(old, "ALTER TABLE sessions DROP COLUMN fence")
    await _execute(old, "ALTER TABLE runs DROP COLUMN webhook_url")
    await _execute(old, "ALTER TABLE runs DROP COLUMN input_parts")
    await _execute(old, "DROP INDEX sessions_listed")
    await _execute(old, "DROP INDEX sessions_stateless")
    await _execute(old, "ALTER TABLE sessions DROP COLUMN stateless")
    await _execute(old, "DELETE FROM schema_version WHERE version > 1")
    await old.close()

    stores = await asyncio.gather(*(open_backend() for _ in range(8)))
    for s in stores:
        assert isinstance(s, SQLiteStore | PostgresStore)
        backend = sqlite_backend if isinstance(s, SQLiteStore) else pg_backend
        assert await s.migrate() == backend.SCHEMA_VERSION >= 4
    assert "sessions_by_principal" in await _index_names(stores[0])
    # the usage ledger was filled from the runs finished before it existed
    day = timedelta(days=1)
    booked = await stores[0].usage_totals(start=T0 - day, end=T0 + day, group_by="principal")
    assert booked == [UsageTotal("alice", 7, 5, 1)]
    assert [s.id for s in await stores[-1].list_sessions("alice")] == ["s1"]
    upgraded = await stores[0].get_session("s1")
    assert upgraded is not None and not upgraded.stateless
    assert {"sessions_listed", "sessions_stateless"} <= await _index_names(stores[0])


async def test_workers_opening_a_new_sqlite_file_together_all_switch_it_to_wal(
    tmp_path: Path,
) -> None:
    # Switching the journal mode fails at once (no busy wait) when another connection is
    # switching too; every opener must retry until the file is in WAL mode.
    for round_ in range(20):
        path = str(tmp_path / f"agent_{round_}.db")
        stores = await asyncio.gather(*(SQLiteStore.connect(path) for _ in range(8)))
        try:
            await stores[0].get_or_create_session("s1", "alice")
            assert await stores[-1].get_session("s1") is not None
        finally:
            await asyncio.gather(*(s.close() for s in stores))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# --- URLs ---------------------------------------------------------------------------------


async def test_sqlite_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    absolute = tmp_path / "abs" / "deeper" / "agent.db"
    for url, path in [
        ("sqlite:///./var/agent.db", tmp_path / "var" / "agent.db"),
        (f"sqlite:///{absolute}", absolute),
    ]:
        s = await open_store(url)
        try:
            assert isinstance(s, SQLiteStore)
            await s.get_or_create_session("s1", "alice")
        finally:
            await s.close()
        assert path.is_file()

    for url in ("sqlite://:memory:", "sqlite:///:memory:"):
        s = await open_store(url)
        try:
            await s.get_or_create_session("s1", "alice")
            assert await s.get_session("s1") is not None
        finally:
            await s.close()


def test_sqlite_path_parsing() -> None:
    assert sqlite_path("sqlite:///./var/agent.db") == "./var/agent.db"
    assert sqlite_path("sqlite:///var/agent.db") == "var/agent.db"
    assert sqlite_path("sqlite:////abs/agent.db") == "/abs/agent.db"
    assert sqlite_path("sqlite://:memory:") == ":memory:"
    assert sqlite_path("sqlite:///:memory:") == ":memory:"
    for bad in ("sqlite://", "sqlite:///", "sqlite://host/x.db"):
        with pytest.raises(StorageConfigError, match="AGENT_DATABASE_URL"):
            sqlite_path(bad)


@pytest.mark.parametrize(
    "url", ["mysql://root:hunter2@db/app", "redis://:hunter2@localhost", "hunter2", ""]
)
async def test_unsupported_url_is_a_clear_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="AGENT_DATABASE_URL") as caught:
        await open_store(url)
    assert isinstance(caught.value, StorageConfigError)
    assert "hunter2" not in str(caught.value)


def test_redact_url() -> None:
    assert redact_url("postgresql://u:p%40ss@h:5432/db?sslmode=require") == (
        "postgresql://u:***@h:5432/db?sslmode=require"
    )
    assert redact_url("postgresql://h/db?user=u&password=secret") == (
        "postgresql://h/db?user=u&password=***"
    )
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


# --- PostgreSQL failures ------------------------------------------------------------------


def _everything_said(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:s3cret-Pa55@127.0.0.1:1/test",
        "postgres://postgres@127.0.0.1:1/test?password=s3cret-Pa55",
    ],
)
async def test_unreachable_postgres_is_unavailable_without_password(url: str) -> None:
    with pytest.raises(StorageUnavailable, match="cannot connect to PostgreSQL") as caught:
        await open_store(url)
    said = _everything_said(caught.value)
    assert "s3cret-Pa55" not in said
    assert "127.0.0.1:1" in said


@pytest.mark.postgres
async def test_lost_postgres_is_unavailable_then_recovers() -> None:
    proxy = TcpProxy(target_port=urlsplit(POSTGRES_URL).port or 5432)
    await proxy.start()
    async with postgres_schema() as (url, _):
        store = await PostgresStore.connect(with_port(url, proxy.port), operation_timeout=5)
        try:
            await store.get_or_create_session("s1", "alice")

            await proxy.cut()
            with pytest.raises(StorageUnavailable, match="unavailable") as caught:
                await store.get_session("s1")
            assert "s3cret" not in _everything_said(caught.value)
            with pytest.raises(StorageUnavailable):
                await store.ping()

            await proxy.start()  # same port: the database is back
            assert await store.get_session("s1") is not None
        finally:
            await store.close()
            await proxy.cut()


@pytest.mark.postgres
async def test_postgres_server_settings_in_url_select_the_schema() -> None:
    async with postgres_schema() as (url, schema):
        store = await PostgresStore.connect(url)
        try:
            await store.get_or_create_session("s1", "alice")
        finally:
            await store.close()
        other = await PostgresStore.connect(POSTGRES_URL, server_settings={"search_path": schema})
        try:
            assert await other.get_session("s1") is not None
        finally:
            await other.close()
    assert with_query("postgresql://h/db?a=1", b="2") == "postgresql://h/db?a=1&b=2"
