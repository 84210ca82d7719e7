"""What a run writes to the store: one that starts at once is resumable from its first write
(its record carries its first checkpoint), one that waits for a slot stores its first
checkpoint when it starts, every run's end is one write that also deletes its checkpoint, and
a final answer's checkpoint is written only when the run's end is late."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import AgentCore
from agent_runtime.agent import AgentRunContext
from agent_runtime.extensions.base import AgentExtension
from agent_runtime.messages import AssistantMessage
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import LocalBus
from app.runs import RunManager, RunRequestOptions, checkpoints
from app.storage import Store, open_store
from app.telemetry.metrics import Metrics
from tests.support.waiting import wait_until

_READS = frozenset({"get_session", "list_messages", "get_run", "get_checkpoint"})


class RecordingStore:
    """A real store that records each write it is asked for, with its keywords."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method) or name == "close" or name in _READS:
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.writes.append((name, {"args": args, **kwargs}))
            return await method(*args, **kwargs)

        return call

    def of(self, run_id: str) -> list[str]:
        """The names of the writes made for ``run_id``."""
        return [name for name, call in self.writes if _run_of(name, call) == run_id]


def _run_of(name: str, call: dict[str, Any]) -> str | None:
    args = call["args"]
    if name == "create_run":
        return str(args[0].run_id)
    if name == "save_checkpoint":
        return str(args[0].run_id)
    if name in ("append_messages", "remove_last_turn"):
        return str(args[1])
    return str(args[0]) if args else None


@dataclass
class World:
    manager: RunManager
    store: RecordingStore
    model: ScriptedModel
    release: asyncio.Event
    calls: list[str]

    def write(self, name: str, run_id: str) -> dict[str, Any]:
        (found,) = [c for n, c in self.store.writes if n == name and _run_of(n, c) == run_id]
        return found


class SlowEnd(AgentExtension):
    """Holds each run after its final answer until ``release`` is set."""

    name = "slow_end"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        await self.release.wait()


async def _world(
    tmp_path: Path,
    turns: list[Any],
    *,
    resume_runs: bool,
    slots: int,
    extensions: tuple[AgentExtension, ...] = (),
) -> AsyncIterator[World]:
    real = await open_store(f"sqlite:///{tmp_path}/a.db")
    store = RecordingStore(real)
    bus = LocalBus()
    release = asyncio.Event()
    calls: list[str] = []

    @tool
    async def wait_here() -> str:
        """Wait until the test lets go."""
        calls.append("called")
        await release.wait()
        return "done"

    model = ScriptedModel(turns)
    agent = AgentCore(model, tools=[wait_here], extensions=extensions)
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=slots, max_queued=4),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=5,
        lease_seconds=30,
        resume_runs=resume_runs,
    )
    try:
        yield World(manager, store, model, release, calls)
    finally:
        release.set()
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await real.close()


# a run that calls the tool (and waits in it until released), then answers
_HELD = [tool_call_turn("wait_here", {}), "held"]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async for made in _world(tmp_path, _HELD, resume_runs=True, slots=4):
        yield made


@pytest.fixture
async def one_slot(tmp_path: Path) -> AsyncIterator[World]:
    async for made in _world(tmp_path, [*_HELD, "answered"], resume_runs=True, slots=1):
        yield made


@pytest.fixture
async def answering(tmp_path: Path) -> AsyncIterator[World]:
    async for made in _world(tmp_path, ["answered"], resume_runs=True, slots=4):
        yield made


@pytest.fixture
async def not_resumable(tmp_path: Path) -> AsyncIterator[World]:
    async for made in _world(tmp_path, ["answered"], resume_runs=False, slots=4):
        yield made


async def _finished(world: World, session_id: str) -> str:
    handle = await world.manager.start("anonymous", session_id, RunRequestOptions(input="go"))
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    return handle.run_id


async def test_a_run_s_first_checkpoint_is_written_with_its_record(world: World) -> None:
    handle = await world.manager.start("anonymous", "s1", RunRequestOptions(input="go"))
    await wait_until(lambda: world.calls == ["called"])
    # resumable from its first write: the record and the step-0 checkpoint, one transaction
    created = world.write("create_run", handle.run_id)
    first = created["checkpoint"]
    assert (first.step, first.event_seq, first.fence) == (0, 0, handle.lease.token)
    stored = await world.store.store.get_checkpoint(handle.run_id)
    assert stored is not None and stored.step >= 0
    world.release.set()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    # its end: the turn, the outcome and the checkpoint's deletion in one write
    assert world.store.of(handle.run_id) == [
        "create_run",
        "save_checkpoint",  # the model's answer with the tool call
        "save_checkpoint",  # the call's start (the tool is not idempotent)
        "save_checkpoint",  # its result
        "end_run",  # not the final answer's: the end deletes the checkpoint with it
    ]
    ended = world.write("end_run", handle.run_id)
    assert ended["delete_checkpoint"] is True and ended["fence"] == handle.lease.token
    assert [m["role"] for m in ended["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert await world.store.store.get_checkpoint(handle.run_id) is None
    record = await world.store.store.get_run(handle.run_id)
    assert record is not None and record.status == "completed"
    assert len(await world.store.store.list_messages("s1")) == 4
    world.model.assert_consumed()


async def test_a_run_that_waits_for_a_slot_stores_its_first_checkpoint_as_it_starts(
    one_slot: World,
) -> None:
    world = one_slot
    holder = await world.manager.start(
        "anonymous", "s1", RunRequestOptions(input="go", background=True)
    )
    await wait_until(lambda: world.calls == ["called"])
    queued = await world.manager.start(
        "anonymous", "s2", RunRequestOptions(input="go", background=True)
    )
    assert queued.status == "queued"
    # nothing to resume while it waits: its record alone
    assert world.write("create_run", queued.run_id)["checkpoint"] is None
    assert world.store.of(queued.run_id) == ["create_run"]
    world.release.set()
    await asyncio.wait_for(asyncio.shield(queued.finished), 10)
    await asyncio.wait_for(asyncio.shield(holder.finished), 10)
    writes = world.store.of(queued.run_id)
    assert writes[0] == "create_run" and writes[-1] == "end_run"
    steps = [
        call["args"][0].step
        for name, call in world.store.writes
        if name == "save_checkpoint" and _run_of(name, call) == queued.run_id
    ]
    assert steps[0] == 0 and steps[1:] == sorted(steps[1:]) and 0 not in steps[1:]
    assert world.write("end_run", queued.run_id)["delete_checkpoint"] is True
    assert await world.store.store.get_checkpoint(queued.run_id) is None
    world.model.assert_consumed()


async def test_without_resumes_a_run_writes_no_checkpoint(not_resumable: World) -> None:
    world = not_resumable
    run_id = await _finished(world, "s1")
    assert world.store.of(run_id) == ["create_run", "end_run"]
    assert world.write("create_run", run_id)["checkpoint"] is None
    assert world.write("end_run", run_id)["delete_checkpoint"] is False
    world.model.assert_consumed()


async def test_a_run_that_answers_at_once_is_two_writes(answering: World) -> None:
    world = answering
    run_id = await _finished(world, "s1")
    # its record with its first checkpoint, then its end (which deletes it): the final
    # answer's checkpoint is never written, its end coming first
    assert world.store.of(run_id) == ["create_run", "end_run"]
    assert world.write("end_run", run_id)["delete_checkpoint"] is True
    assert await world.store.store.get_checkpoint(run_id) is None
    record = await world.store.store.get_run(run_id)
    assert record is not None and record.status == "completed"
    world.model.assert_consumed()


@pytest.fixture
async def slow_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[World, SlowEnd]]:
    monkeypatch.setattr(checkpoints, "FINAL_WAIT", 0.01)
    slow = SlowEnd()
    async for made in _world(tmp_path, ["answered"], resume_runs=True, slots=4, extensions=(slow,)):
        yield made, slow


async def test_a_final_answer_s_checkpoint_is_written_when_the_end_is_late(
    slow_end: tuple[World, SlowEnd],
) -> None:
    world, slow = slow_end
    handle = await world.manager.start("anonymous", "s1", RunRequestOptions(input="go"))

    async def final_stored() -> bool:
        stored = await world.store.store.get_checkpoint(handle.run_id)
        return stored is not None and stored.step == 1

    # held after its answer: the answer's checkpoint is stored, as any other
    await wait_until(final_stored)
    assert world.store.of(handle.run_id) == ["create_run", "save_checkpoint"]
    slow.release.set()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    assert world.store.of(handle.run_id) == ["create_run", "save_checkpoint", "end_run"]
    assert await world.store.store.get_checkpoint(handle.run_id) is None
