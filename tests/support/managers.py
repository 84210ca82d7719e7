"""A run manager as a worker builds one, a run some other worker left behind, and what the
lost-run sweep must leave of it, for tests that drive ``RunManager`` in-process."""

from __future__ import annotations

from typing import Any

import pytest

from agent_runtime import AgentCore
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import Bus, LeaseLost
from app.bus.wire import WireEncoder
from app.runs import RunManager
from app.storage import RunRecord, Store
from app.telemetry.metrics import Metrics


def run_manager(agent: AgentCore, store: Store, bus: Bus, **options: Any) -> RunManager:
    """The default agents' manager with small limits: 4 slots, 4 queue places, 1 s queue wait
    (``options``: more of ``RunManager``'s keywords)."""
    return RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=4, max_queued=4),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=1,
        lease_seconds=30,
        **options,
    )


async def orphan(
    store: Store, bus: Bus, run_id: str, session_id: str, *, webhook_url: str | None = None
) -> None:
    """A run some other worker started and wrote two events of, then died."""
    await store.get_or_create_session(session_id, "anonymous")
    await store.create_run(
        RunRecord(
            run_id=run_id,
            session_id=session_id,
            principal="anonymous",
            agent="default",
            input="x",
            status="running",
            webhook_url=webhook_url,
        )
    )
    await bus.events.create(run_id, session_id=session_id, fence=1)
    encoder = WireEncoder(run_id, session_id)
    await bus.events.append(run_id, encoder.encode(1, "run.started", 0.0, {}), fence=1)
    await bus.events.append(run_id, encoder.encode(2, "text.delta", 0.0, {"delta": "a"}), fence=1)


async def check_lost_run_ended(manager: RunManager, store: Store, bus: Bus) -> None:
    """After a sweep over the orphans ``run_dead`` (lost) and ``run_alive`` (still held)."""
    dead = await store.get_run("run_dead")
    assert dead is not None and dead.status == "failed"
    assert dead.error is not None and dead.error["code"] == "worker_lost"
    still = await store.get_run("run_alive")
    assert still is not None and still.status == "running"
    assert await bus.locks.holder("s-dead") is None
    # the lost worker, back from the dead, can no longer write to the log
    with pytest.raises(LeaseLost):
        await bus.events.append(
            "run_dead", WireEncoder("run_dead", "s-dead").encode(3, "text.delta", 0.0, {}), fence=1
        )
    assert await manager.reap_lost_runs() == 0  # nothing left to sweep
