"""An answer posted to a worker while it hands the run over: refused with 503 ``draining``
(post it again), never accepted and then lost, and the run that took one is not handed over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_runtime import AgentCore
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import LocalBus
from app.errors import Draining
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.storage import Store, open_store
from app.telemetry.metrics import Metrics
from tests.support.waiting import wait_until


@dataclass
class World:
    manager: RunManager
    store: Store
    effects: list[str]

    async def waiting_run(self) -> RunHandle:
        handle = await self.manager.start(
            "anonymous", "s1", RunRequestOptions(input="write it", background=True)
        )
        await wait_until(lambda: self.manager.live_status(handle) == "waiting")
        return handle

    async def answer(self, handle: RunHandle) -> list[str]:
        return await self.manager.routing.external_event(
            "anonymous",
            "s1",
            handle.run_id,
            ExternalEvent("confirmation_response", {"tool_call_id": "call_1", "approved": True}),
        )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    bus = LocalBus()
    effects: list[str] = []

    @tool(policy="ask")
    def append_line(text: str) -> str:
        """Append a line (a side effect)."""
        effects.append(text)
        return "appended"

    agent = AgentCore(
        ScriptedModel([tool_call_turn("append_line", {"text": "x"}, call_id="call_1"), "done"]),
        tools=[append_line],
        extensions=[ConfirmationExtension(timeout=600)],
    )
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=4, max_queued=4),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=1,
        lease_seconds=30,
        resume_runs=True,
        hand_over=True,
    )
    try:
        yield World(manager, store, effects)
    finally:
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_an_answer_during_the_hand_over_is_refused_to_be_posted_again(
    world: World,
) -> None:
    handle = await world.waiting_run()
    world.manager.begin_drain()  # parks the waiting run: cancelled for hand-over, not yet parked
    with pytest.raises(Draining) as refused:
        await world.answer(handle)
    assert refused.value.retry_after is not None
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    # parked: still unfinished in the store, and an answer here is still refused the same way
    record = await world.store.get_run(handle.run_id)
    assert record is not None and not record.is_finished
    with pytest.raises(Draining):
        await world.answer(handle)
    assert world.effects == []


async def test_a_run_that_took_its_answer_is_not_parked_and_finishes(world: World) -> None:
    handle = await world.waiting_run()
    assert await world.answer(handle) == ["ConfirmationExtension"]
    # the drain begins before the run woke to take the answer: it finishes here instead
    world.manager.begin_drain()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    assert handle.status == "completed"
    assert world.effects == ["x"]
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.status == "completed"
