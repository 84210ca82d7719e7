"""Run checkpoints in the store, on SQLite and PostgreSQL alike: saved in place, taken over
with a newer fencing token, and refused from a worker fenced off."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.storage import CheckpointRecord, RunRecord, StaleFence, Store
from tests.support.storage import (
    open_backend_fixture,  # noqa: F401 - provides the fixture open_backend
    store_fixture,  # noqa: F401 - provides the fixture store
)


def _checkpoint(step: int, event_seq: int) -> CheckpointRecord:
    return CheckpointRecord(
        run_id="run_a",
        session_id="s1",
        step=step,
        event_seq=event_seq,
        data={"version": 1, "step": step},
        updated_at=datetime.now(UTC),
    )


async def _world(store: Store) -> None:
    await store.get_or_create_session("s1", "alice")
    await store.create_run(
        RunRecord(
            run_id="run_a",
            session_id="s1",
            principal="alice",
            agent="default",
            input="hello",
            status="running",
        )
    )


async def test_a_checkpoint_is_saved_in_place_and_taken_over(store: Store) -> None:
    await _world(store)
    assert await store.get_checkpoint("run_a") is None
    assert await store.take_over_checkpoint("run_a", fence=3) is None
    await store.save_checkpoint(_checkpoint(1, 4), fence=3)
    await store.save_checkpoint(_checkpoint(2, 9), fence=3)
    saved = await store.get_checkpoint("run_a")
    assert saved is not None
    assert (saved.step, saved.event_seq, saved.data, saved.resumes) == (
        2,
        9,
        {"version": 1, "step": 2},
        0,
    )
    assert await store.park_checkpoint("run_a", fence=3, reason="shutdown")
    parked = await store.get_checkpoint("run_a")
    assert parked is not None and parked.handover == "shutdown"
    taken = await store.take_over_checkpoint("run_a", fence=8)
    assert taken is not None and (taken.resumes, taken.fence, taken.step) == (1, 8, 2)
    # the new holder's next save keeps the count and clears the hand-over
    await store.save_checkpoint(_checkpoint(3, 12), fence=8)
    again = await store.get_checkpoint("run_a")
    assert again is not None and (again.resumes, again.handover, again.step) == (1, None, 3)
    await store.delete_checkpoint("run_a", fence=8)
    assert await store.get_checkpoint("run_a") is None


async def test_a_fenced_off_worker_s_checkpoint_is_refused(store: Store) -> None:
    await _world(store)
    await store.save_checkpoint(_checkpoint(1, 4), fence=5)
    # another worker took the run over with a newer token
    assert await store.take_over_checkpoint("run_a", fence=9) is not None
    with pytest.raises(StaleFence) as raised:
        await store.save_checkpoint(_checkpoint(2, 7), fence=5)
    assert (raised.value.fence, raised.value.stored) == (5, 9)
    with pytest.raises(StaleFence):
        await store.park_checkpoint("run_a", fence=5, reason="shutdown")
    # and its run's end, written late, is refused too
    with pytest.raises(StaleFence):
        await store.update_run("run_a", status="failed", error={"code": "x"}, fence=5)
    # nor may it delete the checkpoint the new holder resumes from
    await store.delete_checkpoint("run_a", fence=5)
    kept = await store.get_checkpoint("run_a")
    assert kept is not None and kept.step == 1 and kept.handover is None


async def test_a_run_written_with_a_newer_token_refuses_an_older_checkpoint(store: Store) -> None:
    await _world(store)
    await store.update_run("run_a", status="waiting", fence=6)
    with pytest.raises(StaleFence):
        await store.save_checkpoint(_checkpoint(1, 2), fence=4)
    assert await store.get_checkpoint("run_a") is None


async def test_a_checkpoint_goes_with_its_session(store: Store) -> None:
    await _world(store)
    await store.save_checkpoint(_checkpoint(1, 1), fence=1)
    assert await store.delete_session("s1")
    assert await store.get_checkpoint("run_a") is None
