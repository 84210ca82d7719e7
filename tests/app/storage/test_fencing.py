"""Fenced writes, on SQLite and PostgreSQL alike: a write carrying an older fencing token than
one the run (or the session's messages) was already written with is refused by the store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.storage import StaleFence, Store
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    running_run,
    store_fixture,  # noqa: F401 - provides the fixture store
)


def _turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": text}]


async def _world(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(running_run("run_a"))


async def test_a_newer_token_refuses_an_older_one_on_the_run(store: Store) -> None:
    await _world(store)
    await store.update_run("run_a", status="waiting", fence=5)
    # the sweep took the session's lock (token 9) and ended the run
    failed = await store.update_run(
        "run_a", status="failed", error={"code": "worker_lost", "message": "lost"}, fence=9
    )
    assert failed.status == "failed"
    # the worker that lost its lease comes back with token 5: refused, nothing changes
    with pytest.raises(StaleFence) as raised:
        await store.update_run("run_a", status="completed", output={"content": "late"}, fence=5)
    assert (raised.value.fence, raised.value.stored) == (5, 9)
    record = await store.get_run("run_a")
    assert record is not None and record.status == "failed" and record.output is None


async def test_a_stale_token_cannot_move_an_unfinished_run(store: Store) -> None:
    await _world(store)
    await store.update_run("run_a", status="running", fence=7)
    with pytest.raises(StaleFence):
        await store.update_run("run_a", status="waiting", fence=6)
    record = await store.get_run("run_a")
    assert record is not None and record.status == "running"
    # the same token, or a newer one, writes; an unfenced write (recovery) is not refused
    assert (await store.update_run("run_a", status="waiting", fence=7)).status == "waiting"
    assert (await store.update_run("run_a", status="running", fence=8)).status == "running"
    assert (await store.update_run("run_a", status="waiting")).status == "waiting"


async def test_a_finished_run_answers_as_before_to_a_current_token(store: Store) -> None:
    await _world(store)
    await store.update_run("run_a", status="completed", output={"content": "ok"}, fence=3)
    # the same writer again (a retry): the stored run, unchanged, no error
    again = await store.update_run("run_a", status="failed", fence=3)
    assert again.status == "completed"


async def test_messages_after_a_newer_token_wrote_the_run_are_refused(store: Store) -> None:
    await _world(store)
    await store.update_run("run_a", status="failed", fence=9)  # the sweep ended it
    with pytest.raises(StaleFence):
        await store.append_messages("s1", "run_a", _turn("late"), fence=5)
    assert await store.list_messages("s1") == []
    session = await store.get_session("s1")
    assert session is not None and session.message_count == 0


async def test_messages_after_a_newer_run_of_the_session_are_refused(store: Store) -> None:
    await _world(store)
    await store.create_run(running_run("run_b"))
    await store.append_messages("s1", "run_b", _turn("b"), fence=12)  # the session's next run
    with pytest.raises(StaleFence):
        await store.append_messages("s1", "run_a", _turn("a"), fence=11)
    stored = await store.list_messages("s1")
    assert [m.run_id for m in stored] == ["run_b", "run_b"]
    # a newer token appends, and the unfenced path is unchanged
    await store.append_messages("s1", "run_b", _turn("c"), fence=12)
    await store.append_messages("s1", "run_b", _turn("d"))
    assert len(await store.list_messages("s1")) == 6


async def test_racing_writers_one_token_wins(store: Store) -> None:
    # whatever the interleaving, the older token never lands after the newer one
    await _world(store)
    results = await asyncio.gather(
        store.update_run("run_a", status="failed", error={"code": "worker_lost"}, fence=20),
        store.update_run("run_a", status="completed", output={"content": "x"}, fence=10),
        return_exceptions=True,
    )
    record = await store.get_run("run_a")
    assert record is not None
    if isinstance(results[1], StaleFence):
        assert record.status == "failed"
    else:
        # the older writer went first and ended the run; the newer one found it finished
        assert record.status == "completed"
        assert not isinstance(results[0], BaseException)
