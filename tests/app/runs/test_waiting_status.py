"""A run reads ``waiting`` only once its question is in its log: a front end that polls the
run's status and then reads its events finds the confirmation request it must answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_runtime import AgentCore, AgentPhase
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import LocalBus, WireEvent
from app.runs import RunManager, RunRequestOptions
from app.storage import open_store
from app.telemetry.metrics import Metrics
from tests.support.waiting import wait_until


class HeldBus(LocalBus):
    """The in-process bus whose awaited appends of ``custom`` events wait for the test: the
    confirmation request on its way to the log (as over a slow link to Redis)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        events = self.events
        append = events.append

        async def held_append(run_id: str, event: WireEvent, *, fence: int) -> None:
            if event.type == "custom":
                self.held.set()
                await self.release.wait()
            await append(run_id, event, fence=fence)

        events.append = held_append  # type: ignore[method-assign]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[RunManager, AgentCore, HeldBus]]:
    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    bus = HeldBus()

    @tool(policy="ask")
    def append_line(text: str) -> str:
        """Append a line to the file (a side effect)."""
        return "appended"

    agent = AgentCore(
        ScriptedModel([tool_call_turn("append_line", {"text": "x"}), "written"]),
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
    )
    try:
        yield manager, agent, bus
    finally:
        bus.release.set()
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_a_run_reads_waiting_once_its_question_is_in_the_log(
    world: tuple[RunManager, AgentCore, HeldBus],
) -> None:
    manager, agent, bus = world
    handle = await manager.start(
        "anonymous", "s1", RunRequestOptions(input="write it", background=True)
    )
    await bus.held.wait()
    # the runtime asked and waits for the answer; the question is not in the log yet
    await wait_until(lambda: agent.active_runs[handle.run_id].phase is AgentPhase.WAITING)
    assert manager.live_status(handle) == "running"
    assert manager.handle_view(handle)["status"] == "running"
    bus.release.set()
    await wait_until(lambda: manager.live_status(handle) == "waiting")
    subscription = await bus.events.subscribe(handle.run_id)
    logged = await subscription.next()
    await subscription.aclose()
    assert [event.type for event in logged][-1] == "custom"
    answered = await manager.routing.external_event(
        "anonymous",
        "s1",
        handle.run_id,
        ExternalEvent(
            "confirmation_response", {"tool_call_id": "call_append_line", "approved": True}
        ),
    )
    assert answered == ["ConfirmationExtension"]
    await handle.finished
    assert handle.status == "completed"
