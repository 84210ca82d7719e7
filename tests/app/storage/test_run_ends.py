"""A run's start with its first checkpoint, and its end, each one transaction, on SQLite and
PostgreSQL alike: all of it is stored, or (a stale token, a bad message, a missing run)
nothing, and every part keeps the fencing of the single write it stands for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.storage import (
    CheckpointRecord,
    RunAlreadyExists,
    RunNotFound,
    RunRecord,
    SessionOwnedByOther,
    StaleFence,
    Store,
    WebhookMessage,
)
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    store_fixture,  # noqa: F401 - provides the fixture store
)


def _run(run_id: str = "run_a", principal: str = "alice") -> RunRecord:
    return RunRecord(
        run_id=run_id,
        session_id="s1",
        principal=principal,
        agent="default",
        input="hello",
        status="running",
    )


def _first(run_id: str = "run_a", fence: int = 4) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        session_id="s1",
        step=0,
        event_seq=0,
        data={"version": 1, "step": 0},
        fence=fence,
        updated_at=datetime.now(UTC),
    )


def _turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": text}]


async def _started(store: Store, fence: int = 4) -> None:
    """run_a of a new session s1, with its first checkpoint under ``fence``."""
    await store.create_run(_run(), create_session=True, checkpoint=_first(fence=fence))


async def _end(store: Store, fence: int | None = 4, **changes: Any) -> bool:
    arguments: dict[str, Any] = {
        "session_id": "s1",
        "messages": _turn("hi"),
        "status": "completed",
        "output": {"content": "hi"},
        "usage": {"input_tokens": 3, "output_tokens": 2},
        "model": "demo",
        "fence": fence,
        "delete_checkpoint": True,
    }
    arguments.update(changes)
    return await store.end_run("run_a", **arguments)


async def _unchanged(store: Store, *, checkpoint: bool = True) -> None:
    """Nothing of run_a's end was stored."""
    record = await store.get_run("run_a")
    assert record is not None and record.status == "running" and record.output is None
    assert await store.list_messages("s1") == []
    session = await store.get_session("s1")
    assert session is not None and session.message_count == 0
    assert (await store.get_checkpoint("run_a") is not None) is checkpoint


async def test_a_run_is_stored_with_its_first_checkpoint(store: Store) -> None:
    await _started(store, fence=4)
    record = await store.get_run("run_a")
    assert record is not None and record.status == "running"
    saved = await store.get_checkpoint("run_a")
    assert saved is not None
    assert (saved.step, saved.event_seq, saved.fence, saved.data, saved.resumes) == (
        0,
        0,
        4,
        {"version": 1, "step": 0},
        0,
    )
    # it is the run's checkpoint like any other: replaced by the next, refused to a stale token
    with pytest.raises(StaleFence):
        await store.save_checkpoint(
            CheckpointRecord(
                run_id="run_a",
                session_id="s1",
                step=1,
                event_seq=3,
                data={"version": 1, "step": 1},
                updated_at=datetime.now(UTC),
            ),
            fence=3,
        )
    taken = await store.take_over_checkpoint("run_a", fence=5)
    assert taken is not None and (taken.step, taken.resumes, taken.fence) == (0, 1, 5)


async def test_a_refused_start_stores_no_checkpoint(store: Store) -> None:
    await store.get_or_create_session("s1", "bob")
    with pytest.raises(SessionOwnedByOther):
        await store.create_run(_run(), checkpoint=_first())
    assert await store.get_run("run_a") is None
    assert await store.get_checkpoint("run_a") is None
    await store.create_run(_run(principal="bob"))
    with pytest.raises(RunAlreadyExists):
        await store.create_run(_run(principal="bob"), checkpoint=_first(fence=9))
    assert await store.get_checkpoint("run_a") is None


async def test_a_run_s_end_is_its_turn_its_outcome_and_no_checkpoint(store: Store) -> None:
    await _started(store)
    webhook = WebhookMessage("msg_1", "run_a", "https://hooks.test/x", "run.completed", "{}", 1.0)
    assert await _end(store, webhook=webhook)
    ended = await store.get_run("run_a")
    assert ended is not None and ended.status == "completed" and ended.output == {"content": "hi"}
    assert ended.finished_at is not None and ended.model == "demo"
    assert [m.role for m in await store.list_messages("s1")] == ["user", "assistant"]
    session = await store.get_session("s1")
    assert session is not None and (session.message_count, session.last_run_id) == (2, "run_a")
    assert await store.get_checkpoint("run_a") is None
    assert [state.message.id for state in await store.webhook_states("run_a")] == ["msg_1"]
    # its usage is booked with it
    day = timedelta(days=1)
    now = datetime.now(UTC)
    (total,) = await store.usage_totals(start=now - day, end=now + day, group_by="agent")
    assert (total.input_tokens, total.output_tokens, total.runs) == (3, 2, 1)
    # a repeat (a retry whose first answer was lost) adds nothing: the run is final
    assert not await _end(store, messages=[], status="failed", delete_checkpoint=False)
    again = await store.get_run("run_a")
    assert again is not None and again.status == "completed"
    assert len(await store.webhook_states("run_a")) == 1


async def test_an_end_without_a_turn_or_checkpoint_drop(store: Store) -> None:
    await _started(store)
    assert await _end(
        store, messages=[], status="failed", error={"code": "x"}, delete_checkpoint=False
    )
    ended = await store.get_run("run_a")
    assert ended is not None and ended.status == "failed" and ended.error == {"code": "x"}
    assert await store.list_messages("s1") == []
    assert await store.get_checkpoint("run_a") is not None


async def test_a_stale_token_on_the_run_stores_nothing(store: Store) -> None:
    await _started(store, fence=4)
    # another worker took the run over with a newer token
    assert await store.take_over_checkpoint("run_a", fence=9) is not None
    with pytest.raises(StaleFence) as raised:
        await _end(store, fence=4)
    assert (raised.value.fence, raised.value.stored) == (4, 9)
    await _unchanged(store)
    kept = await store.get_checkpoint("run_a")
    assert kept is not None and kept.fence == 9


async def test_a_stale_token_on_the_session_stores_nothing(store: Store) -> None:
    await _started(store, fence=4)
    # the run's outcome alone would pass; its messages come after a newer run's: refused
    await store.create_run(_run("run_b"))
    await store.append_messages("s1", "run_b", _turn("b"), fence=7)
    with pytest.raises(StaleFence):
        await _end(store, fence=4)
    record = await store.get_run("run_a")
    assert record is not None and record.status == "running"
    assert [m.run_id for m in await store.list_messages("s1")] == ["run_b", "run_b"]
    assert await store.get_checkpoint("run_a") is not None
    # the outcome alone, under the run's own token, is the store's to take
    assert await _end(store, fence=4, messages=[], status="failed", error={"code": "lost"})
    lost = await store.get_run("run_a")
    assert lost is not None and lost.status == "failed"
    assert await store.get_checkpoint("run_a") is None


async def test_a_bad_message_stores_nothing(store: Store) -> None:
    await _started(store)
    with pytest.raises(ValueError, match="role"):
        await _end(store, messages=[{"role": "user", "content": "ok"}, {"content": "no role"}])
    await _unchanged(store)


async def test_an_unknown_run_stores_nothing(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    with pytest.raises(RunNotFound):
        await _end(store)
    assert await store.list_messages("s1") == []
    session = await store.get_session("s1")
    assert session is not None and session.message_count == 0


async def test_an_unfenced_end_deletes_any_checkpoint(store: Store) -> None:
    await _started(store, fence=6)
    assert await _end(store, fence=None)
    assert await store.get_checkpoint("run_a") is None
