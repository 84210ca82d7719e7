"""Fencing, deterministically: a shared bus whose lease renewals can be made to fail, a fake
monotonic clock, and what the worker does for a run before, at and after its lease deadline.

The run waits for the approval of a side-effecting tool; the renewals stop being confirmed.
Before the deadline the worker still acts for the run; from the deadline on it takes no
answer and no cancel for it, runs no tool call, and ends it as ``worker_lost``, written only
under the lease's token, which the store refuses once the sweep wrote with a newer one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import AgentCore
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel, tool_call_turn
from agent_runtime.tools.base import tool
from app.admission.slots import Admission
from app.agents.build import load_config
from app.bus import BusUnavailable, Lease, LocalBus
from app.bus.local import LocalSessionLocks
from app.bus.wire import WireEncoder
from app.errors import Unavailable
from app.http.api.streaming import EventStreamResponse
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.runs.fencing import FENCE_MARGIN
from app.storage import Store, open_store
from app.telemetry.metrics import Metrics
from tests.support.waiting import wait_until

LEASE_SECONDS = 30.0
TTL = LEASE_SECONDS * 2 / 3


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class FlakyLocks(LocalSessionLocks):
    """In-process locks whose renewals fail (as with Redis out of reach) while ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False
        self.renewals = 0

    async def renew(self, lease: Lease, ttl: float) -> None:
        self.renewals += 1
        if self.failing:
            raise BusUnavailable("Redis at test:6379 did not answer within 3 s")
        await super().renew(lease, ttl)


class FlakyBus(LocalBus):
    """The in-process bus, claiming to be shared (so leases matter), with flaky renewals."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.flaky = FlakyLocks()
        self._locks = self.flaky


@dataclass
class World:
    manager: RunManager
    store: Store
    bus: FlakyBus
    clock: Clock
    metrics: Metrics
    effects: list[str] = field(default_factory=list)
    release_tool: asyncio.Event = field(default_factory=asyncio.Event)

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        return 0.0 if value is None else value

    async def waiting_run(self, session_id: str = "s1") -> RunHandle:
        """A run waiting for the approval of its tool call."""
        handle = await self.manager.start(
            "anonymous", session_id, RunRequestOptions(input="write it", background=True)
        )
        await wait_until(lambda: self.manager.live_status(handle) == "waiting")
        return handle

    async def answer(self, handle: RunHandle, approved: bool = True) -> list[str]:
        return await self.manager.routing.external_event(
            "anonymous",
            handle.session_id,
            handle.run_id,
            ExternalEvent(
                "confirmation_response", {"tool_call_id": "call_append_line", "approved": approved}
            ),
        )

    async def logged_types(self, run_id: str) -> list[str]:
        subscription = await self.bus.events.subscribe(run_id)
        types: list[str] = []
        try:
            while not subscription.finished:
                batch: Sequence[Any] = await subscription.next()
                types.extend(event.type for event in batch)
        finally:
            await subscription.aclose()
        return types


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    store = await open_store(f"sqlite:///{tmp_path}/a.db")
    bus = FlakyBus()
    clock = Clock()
    metrics = Metrics()
    effects: list[str] = []
    release = asyncio.Event()

    @tool(policy="ask")
    async def append_line(text: str) -> str:
        """Append a line to the file (a side effect)."""
        effects.append(f"started {text}")
        await release.wait()
        effects.append(f"done {text}")
        return "appended"

    turns = [tool_call_turn("append_line", {"text": "x"}), "written"] * 3
    agent = AgentCore(
        ScriptedModel(turns),
        tools=[append_line],
        extensions=[ConfirmationExtension(timeout=600)],
    )
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=4, max_queued=4),
        metrics=metrics,
        profiles=load_config(None).agents,
        queue_timeout=1,
        lease_seconds=LEASE_SECONDS,
        clock=clock,
        keep_leases=False,  # the test plays the renewal rounds and the watchdog itself
    )
    try:
        yield World(manager, store, bus, clock, metrics, effects, release)
    finally:
        release.set()
        await manager.drain(5)
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_the_deadline_counts_from_the_last_confirmed_renewal(world: World) -> None:
    started = world.clock.now
    handle = await world.waiting_run()
    assert handle.lease_deadline == pytest.approx(started + TTL * (1 - FENCE_MARGIN))
    world.clock.now += 5
    assert await world.manager.leases.renew() is True
    assert handle.lease_deadline == pytest.approx(world.clock.now + TTL * (1 - FENCE_MARGIN))
    # a renewal that Redis does not confirm moves nothing, and the next round comes sooner
    world.bus.flaky.failing = True
    before = handle.lease_deadline
    world.clock.now += 5
    assert await world.manager.leases.renew() is False
    assert handle.lease_deadline == before
    assert world.metric("agent_lease_renewals_failed_total") == 1
    assert world.manager.leases.retry_interval < world.manager.leases.interval
    assert world.manager.fencing.enforce() == 0
    assert not handle.fenced


async def test_before_the_deadline_the_worker_still_acts_for_the_run(world: World) -> None:
    handle = await world.waiting_run()
    world.bus.flaky.failing = True
    assert await world.manager.leases.renew() is False
    world.clock.now = handle.lease_deadline - 0.001
    assert world.manager.fencing.enforce() == 0
    found = await world.manager.find(handle.run_id, "anonymous")
    assert found is handle
    assert world.manager.handle_view(handle)["status"] == "waiting"
    # an answer before the deadline is taken, and the tool runs
    assert await world.answer(handle) == ["ConfirmationExtension"]
    await wait_until(lambda: world.effects == ["started x"])
    world.release_tool.set()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.status == "completed"
    assert world.metric("agent_runs_fenced_total") == 0


async def test_at_the_deadline_the_worker_stops_acting_for_the_run(world: World) -> None:
    handle = await world.waiting_run()
    world.bus.flaky.failing = True
    assert await world.manager.leases.renew() is False
    world.clock.now = handle.lease_deadline  # at the deadline, before the watchdog's turn
    # no answer is taken (503, never 202), no cancel is claimed, no live status is told
    with pytest.raises(Unavailable):
        await world.answer(handle)
    # not this worker's to answer for any more: None (post it again), never taken
    answer = ExternalEvent("x", {})
    assert world.manager.routing.deliver_local(handle.session_id, handle.run_id, answer) is None
    assert world.manager.cancel_local(handle.run_id, "cancel_requested") is False
    with pytest.raises(Unavailable):
        await world.manager.cancel(handle.run_id, "anonymous")
    with pytest.raises(Unavailable):
        await world.manager.find(handle.run_id, "anonymous")
    # the watchdog's turn: the run is fenced off and ends, its tool never having run
    assert world.manager.fencing.enforce() == 1
    assert handle.fenced and handle.fenced_off.done()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    assert world.effects == []
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.status == "failed"
    assert record.error is not None and record.error["code"] == "worker_lost"
    # nothing of the run went out after the deadline but its end (under the lease's token)
    types = await world.logged_types(handle.run_id)
    assert "confirmation_resolved" not in str(types)
    assert "tool.call.completed" not in types
    assert types[-1] == "run.failed"
    assert world.metric("agent_runs_fenced_total") == 1
    assert world.metric("agent_tool_calls_after_lease_total") == 0
    # after its end, the stored run answers
    found = await world.manager.find(handle.run_id, "anonymous")
    assert found is not None and not isinstance(found, RunHandle) and found.status == "failed"


async def test_a_tool_running_at_the_deadline_is_counted_as_finishing_after_it(
    world: World,
) -> None:
    handle = await world.waiting_run()
    assert await world.answer(handle) == ["ConfirmationExtension"]
    await wait_until(lambda: world.effects == ["started x"])
    world.bus.flaky.failing = True
    assert await world.manager.leases.renew() is False
    world.clock.now = handle.lease_deadline + 1
    assert world.manager.fencing.enforce() == 1
    assert world.metric("agent_tool_calls_after_lease_total") == 1
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.status == "failed"
    assert record.error is not None and record.error["code"] == "worker_lost"
    assert await world.store.list_messages(handle.session_id) == []


async def test_after_the_sweep_wrote_the_store_refuses_the_lost_worker(world: World) -> None:
    handle = await world.waiting_run()
    world.bus.flaky.failing = True
    world.clock.now = handle.lease_deadline + 5
    # meanwhile the sweep of another worker took the session over (a newer token) and
    # failed the run in the store
    swept = await world.store.update_run(
        handle.run_id,
        status="failed",
        error={"code": "worker_lost", "message": "ended by the sweep"},
        fence=handle.lease.token + 1,
    )
    assert swept.status == "failed"
    assert world.manager.fencing.enforce() == 1
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.error is not None
    assert record.error["message"] == "ended by the sweep"  # the lost worker's write was refused
    assert world.effects == []


async def test_a_lease_taken_over_fences_the_run_at_once(world: World) -> None:
    handle = await world.waiting_run()
    # the lease lapsed in the bus and another holder has the session
    await world.bus.locks.release(handle.lease)
    other = await world.bus.locks.acquire(handle.session_id, "reaper_x", TTL)
    assert other is not None
    assert await world.manager.leases.renew() is True  # nothing left to retry
    assert handle.fenced
    with pytest.raises(Unavailable):
        await world.answer(handle)
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    assert world.effects == []
    assert world.metric("agent_runs_fenced_total") == 1
    await world.bus.locks.release(other)


async def test_a_single_worker_has_no_deadline(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/b.db")
    bus = LocalBus()
    agent = AgentCore(ScriptedModel(["hello"]))
    manager = RunManager(
        agent=agent,
        store=store,
        bus=bus,
        admission=Admission(max_running=1, max_queued=1),
        metrics=Metrics(),
        profiles=load_config(None).agents,
        queue_timeout=1,
        lease_seconds=LEASE_SECONDS,
    )
    try:
        handle = await manager.start("anonymous", "s1", RunRequestOptions(input="hi"))
        assert handle.lease_deadline == float("inf")
        await asyncio.wait_for(asyncio.shield(handle.finished), 10)
        assert handle.status == "completed"
    finally:
        await manager.aclose()
        await agent.aclose()
        await bus.aclose()
        await store.close()


async def test_a_stream_of_a_fenced_off_run_ends_without_a_terminal_event(world: World) -> None:
    handle = await world.waiting_run()
    response = EventStreamResponse(
        events=world.bus.events, run_id=handle.run_id, manager=world.manager, ping=600
    )
    sent: list[dict[str, Any]] = []
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "extensions": {}}
    streaming = asyncio.ensure_future(response(scope, receive, send))

    def body() -> bytes:
        return b"".join(m.get("body", b"") for m in sent)

    await wait_until(lambda: b"confirmation_requested" in body())
    world.bus.flaky.failing = True
    world.clock.now = handle.lease_deadline
    assert world.manager.fencing.enforce() == 1
    await asyncio.wait_for(streaming, 10)
    for terminal in (b"event: run.completed", b"event: run.failed", b"event: run.cancelled"):
        assert terminal not in body()  # no terminal event from this worker
    assert all(m.get("more_body", True) for m in sent if m["type"] == "http.response.body")
    disconnect.set()
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)


async def test_a_stream_still_open_when_the_drain_is_over_is_cut_without_a_terminal_event(
    world: World,
) -> None:
    # a reader here of a run that goes on elsewhere (held by another worker, or parked to
    # be resumed) must not hold this worker's shutdown: uvicorn would wait for it. Once the
    # drain is over it is cut, and resumes with Last-Event-ID where the run goes on
    events = world.bus.events
    await events.create("run_elsewhere", session_id="s9", fence=1)
    wire = WireEncoder("run_elsewhere", "s9").encode(1, "run.started", 0.0, {})
    await events.append("run_elsewhere", wire, fence=1)
    response = EventStreamResponse(
        events=events, run_id="run_elsewhere", manager=world.manager, ping=600
    )
    sent: list[dict[str, Any]] = []
    aborted: list[bool] = []
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "extensions": {"agent.abort": lambda: aborted.append(True)}}
    streaming = asyncio.ensure_future(response(scope, receive, send))
    await wait_until(lambda: any(b"run.started" in m.get("body", b"") for m in sent))
    assert not streaming.done()
    await world.manager.drain(1)
    await asyncio.wait_for(streaming, 10)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert all(m.get("more_body", True) for m in bodies)  # not ended: cut
    assert aborted == [True]


async def test_an_answer_taken_just_before_the_deadline_starts_no_tool_after_it(
    world: World,
) -> None:
    # The answer is taken before the deadline; the run's task resumes (and would start the
    # tool) only after it: the tool gate, asked right before the call starts, refuses it
    # even though the watchdog has not had its turn yet.
    handle = await world.waiting_run()
    world.bus.flaky.failing = True
    world.clock.now = handle.lease_deadline - 0.001
    assert await world.answer(handle) == ["ConfirmationExtension"]
    world.clock.now = handle.lease_deadline  # before the run's task had a turn
    await asyncio.wait_for(asyncio.shield(handle.finished), 10)
    assert world.effects == []
    assert handle.fenced
    assert world.metric("agent_runs_fenced_total") == 1
    assert world.metric("agent_tool_calls_after_lease_total") == 0
    record = await world.store.get_run(handle.run_id)
    assert record is not None and record.error is not None
    assert record.error["code"] == "worker_lost"
