"""What a run waiting for an answer holds in its worker, and what a parked run leaves there.

A worker may hold thousands of runs waiting for a confirmation, for hours (docs/benchmarks.md,
"Waiting capacity"): these tests pin what each keeps by count and kind, not by size, so they
are deterministic. A waiting run keeps its two tasks (the driver's and the runtime's) and the
chain of coroutines under them, and nothing else that runs: no task of its wait, no loop timer,
no done task. A parked run keeps nothing in the worker but its event log.
"""

from __future__ import annotations

import asyncio
import gc
import types
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_runtime import AgentCore
from agent_runtime.deadlines import Deadlines
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import LocalBus
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.storage import Store, open_store
from app.telemetry.metrics import Metrics
from tests.support.waiting import wait_until

RUNS = 6

# what runs while a run waits for its confirmation, and nothing more
WAITING_CHAIN = Counter(
    {
        "Driver.execute": 1,
        "Driver.stream": 1,
        "AgentCore._stream": 1,  # the runtime's stream (an async generator), read by the driver
        "RunLoop._execute": 1,  # the run's task, AgentCore's (agent_runtime.run_loop)
        "RunLoop._run_loop": 1,
        "ToolCalls.run": 1,
        "ToolCalls._prepare_call": 1,
        "ConfirmationExtension.before_tool": 1,
    }
)


@dataclass
class World:
    manager: RunManager
    agent: AgentCore
    model: ScriptedModel
    extension: ConfirmationExtension
    store: Store
    bus: LocalBus

    async def waiting_run(self, session_id: str) -> RunHandle:
        handle = await self.manager.start(
            "anonymous", session_id, RunRequestOptions(input="write it", background=True)
        )
        await wait_until(lambda: self.manager.live_status(handle) == "waiting")
        return handle


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    bus = LocalBus()

    @tool(policy="ask")
    def append_line(text: str) -> str:
        """Append a line (a side effect)."""
        return "appended"

    extension = ConfirmationExtension(timeout=600)
    # each run calls the tool, then waits for its confirmation until the drain parks it
    model = ScriptedModel(
        [tool_call_turn("append_line", {"text": "x"}, call_id=f"call_{n}") for n in range(RUNS)]
    )
    agent = AgentCore(
        model,
        tools=[append_line],
        extensions=[extension],
        run_timeout=3600,
    )
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=RUNS + 1, max_queued=RUNS + 1),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=1,
        lease_seconds=30,
        resume_runs=True,
        hand_over=True,
    )
    try:
        yield World(manager, agent, model, extension, store, bus)
    finally:
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


def _running_code() -> Counter[str]:
    """The coroutines and async generators alive, by name (after a collection)."""
    gc.collect()
    names: Counter[str] = Counter()
    for item in gc.get_objects():
        if isinstance(item, types.CoroutineType) and item.cr_frame is not None:
            names[item.cr_code.co_qualname] += 1
        elif isinstance(item, types.AsyncGeneratorType) and item.ag_frame is not None:
            names[item.ag_code.co_qualname] += 1
    return names


def _kinds(*kinds: type) -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if isinstance(item, kinds))


async def test_a_waiting_run_keeps_its_two_tasks_and_their_chain_and_nothing_else(
    world: World,
) -> None:
    loop = asyncio.get_running_loop()
    code_before = _running_code()
    tasks_before = _kinds(asyncio.Task)
    timers_before = _kinds(asyncio.TimerHandle)
    futures_before = _kinds(asyncio.Future)
    handles = [await world.waiting_run(f"s{index}") for index in range(RUNS)]

    grown = _running_code() - code_before
    assert grown == Counter({name: RUNS * count for name, count in WAITING_CHAIN.items()})
    # its driver's task and its runtime's; none done and kept (a done task keeps its coroutine)
    assert _kinds(asyncio.Task) - tasks_before == 2 * RUNS
    assert sum(1 for task in asyncio.all_tasks() if task.get_name() == handles[0].run_id) == 2
    # no loop timer of its own: its time limit and its confirmation's expiry are entries among
    # the loop's shared deadlines
    # (the worker's own loops sleep meanwhile: fewer timers than runs, whatever their count)
    assert _kinds(asyncio.TimerHandle) - timers_before < RUNS
    assert len(Deadlines.of(loop)) == 2 * RUNS
    # futures: four a run (its two tasks, the one the driver reads the runtime's next event
    # from, the one the confirmation waits on; the handle makes its own only when asked for
    # one), and the worker's own loops' sleeps meanwhile, fewer than the runs
    assert 4 * RUNS <= _kinds(asyncio.Future) - futures_before < 5 * RUNS


async def test_what_a_waiting_run_holds_has_no_instance_dict(world: World) -> None:
    handle = await world.waiting_run("s1")
    run = world.agent.active_runs[handle.run_id]
    [wait] = world.extension._run_waits[run]
    held: list[object] = [
        handle,
        handle.options,
        handle.usage,
        handle.lease,
        handle.ticket,
        handle.encoder,
        run,
        run.config,
        run.state,
        run._options,
        run._channel,
        run._checkpoints,
        run._options.checkpoint_sink,
        wait,  # its own entry among the loop's deadlines
        *run.state.messages,
    ]
    assert [type(item).__name__ for item in held if hasattr(item, "__dict__")] == []
    # nothing is copied where the request or the agent already holds it
    assert handle.metadata is handle.options.metadata
    assert run._options.tools is world.agent.registry.snapshot()


async def test_a_parked_run_leaves_nothing_in_the_worker_but_its_log(world: World) -> None:
    code_before = _running_code()
    handle = await world.waiting_run("s1")
    run_id = handle.run_id
    world.manager.begin_drain()  # a waiting run is parked at once
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    record = await world.store.get_run(run_id)
    assert record is not None and not record.is_finished  # parked, for a resume elsewhere
    del record, handle
    world.model.requests.clear()  # the test double's record of what it was asked

    # nothing of it runs, waits or is held here
    assert _running_code() - code_before == Counter()  # none of its chain is left
    assert not any(task.get_name() == run_id for task in asyncio.all_tasks())
    assert world.manager.local(run_id) is None
    assert run_id not in world.agent.active_runs
    assert world.extension.pending_count() == 0 and world.extension.staged_count() == 0
    assert len(Deadlines.of(asyncio.get_running_loop())) == 0
    assert await world.bus.locks.holder("s1") is None
    # its id is a key of one map only, the in-process event log's (a reader may still be
    # replayed the run's events until the worker exits; a shared bus keeps them in Redis)
    gc.collect()
    maps = [
        item
        for item in gc.get_objects()
        if isinstance(item, dict | set | frozenset) and run_id in item
    ]
    assert maps == [world.bus.events._logs]
