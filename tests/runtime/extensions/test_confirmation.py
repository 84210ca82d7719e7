"""ConfirmationExtension: approval of ``ask`` tool calls, expiry, batches, and delivery races."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, TypeAlias, TypeVar

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    AgentPhase,
    AgentRunConfig,
    ConfigurationError,
    RunCancelledError,
    RunError,
    ToolCall,
    tool,
)
from agent_runtime.errors import EditNotAllowedError
from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESPONSE,
    ConfirmationExtension,
    format_expiry,
)
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.messages import AssistantMessage, ToolMessage, UserMessage
from agent_runtime.model import ModelRequest
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "confirmation.py"
NAME = "ConfirmationExtension"
T = TypeVar("T")
Job: TypeAlias = Callable[[], Any]
# releases the GIL while yielding the CPU; a no-op where the platform lacks it
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


class Files:
    """A pretend file store with an ``ask``-policy delete tool that records every run."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self._lock = threading.Lock()  # the tool is sync, so it runs in worker threads

        @tool(policy="ask")
        def delete_file(path: str) -> str:
            """Delete a file."""
            with self._lock:
                self.deleted.append(path)
            return f"Deleted {path}"

        @tool
        def list_files() -> list[str]:
            """List the files."""
            return ["a.txt", "b.txt"]

        self.delete_file = delete_file
        self.list_files = list_files


def confirmation_agent(
    ext: ConfirmationExtension, files: Files, *turns: Any, **kwargs: Any
) -> AgentCore:
    script = turns or (tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"), "done")
    return AgentCore(
        ScriptedModel(script),
        tools=[files.delete_file, files.list_files],
        extensions=[ext],
        **kwargs,
    )


def response(call_id: str, approved: Any = True, **extra: Any) -> ExternalEvent:
    return ExternalEvent(
        CONFIRMATION_RESPONSE, {"tool_call_id": call_id, "approved": approved, **extra}
    )


def is_request(event: AgentEvent) -> bool:
    return event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED


async def next_request(events: AsyncIterator[AgentEvent]) -> dict[str, Any]:
    async for event in events:
        if is_request(event):
            assert event.payload is not None
            return event.payload
    raise AssertionError("the run ended without a confirmation request")


async def drain(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    return [event async for event in events]


def completed_calls(events: Sequence[AgentEvent]) -> list[AgentEvent]:
    return [e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED]


def assert_clean(agent: AgentCore, ext: ConfirmationExtension) -> None:
    assert ext.pending_count() == 0, "a wait was left registered"
    assert ext.staged_count() == 0, "an answer was left staged"
    assert not agent.active_runs
    assert not agent.active_sessions


# -- construction -------------------------------------------------------------------------------


def test_defaults_and_name() -> None:
    ext = ConfirmationExtension()
    assert ext.name == NAME
    assert ext.timeout == 300.0
    assert ext.response_event_names == frozenset({CONFIRMATION_RESPONSE})
    assert ext.correlation_field == "tool_call_id"


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), True, "5"])
def test_timeout_must_be_positive_and_finite(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        ConfirmationExtension(timeout=timeout)


def test_format_expiry() -> None:
    moment = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
    assert format_expiry(moment) == "2026-11-30T12:00:00.123Z"
    plus_two = moment.astimezone(timezone(timedelta(hours=2)))
    assert format_expiry(plus_two) == "2026-11-30T12:00:00.123Z"
    with pytest.raises(ValueError, match="aware"):
        format_expiry(datetime(2026, 1, 1))


# -- approval -----------------------------------------------------------------------------------


async def test_request_payload_and_approval_runs_the_held_call() -> None:
    files, ext = Files(), ConfirmationExtension(timeout=60)
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1", request_id="r1")
    events = agent.stream("delete a.txt", config=config)
    before = datetime.now(UTC)
    request = await next_request(events)
    assert set(request) == {
        "tool_call_id",
        "tool",
        "arguments",
        "question",
        "response_event",
        "expires_at",
    }
    assert request["tool_call_id"] == "c1"
    assert request["tool"] == "delete_file"
    assert request["arguments"] == {"path": "a.txt"}
    assert "delete_file" in request["question"] and "a.txt" in request["question"]
    assert request["response_event"] == CONFIRMATION_RESPONSE
    assert request["expires_at"].endswith("Z")
    expires = datetime.fromisoformat(request["expires_at"].replace("Z", "+00:00"))
    assert before + timedelta(seconds=59) < expires <= datetime.now(UTC) + timedelta(seconds=60)
    run = next(iter(agent.active_runs.values()))
    assert run.phase is AgentPhase.WAITING
    assert files.deleted == []
    # changing the arguments of a tool that takes no edits is refused, using nothing up
    forged = response("c1", True, arguments={"path": "/etc/passwd"})
    with pytest.raises(EditNotAllowedError):
        agent.emit_external_event(forged, config=config)
    # other extra keys (even one naming another tool) are ignored
    extra = response("c1", True, tool="rm")
    assert agent.emit_external_event(extra, config=config) == [NAME]
    rest = await drain(events)
    assert files.deleted == ["a.txt"]
    [done] = completed_calls(rest)
    assert not done.is_error and done.result == "Deleted a.txt"
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    assert_clean(agent, ext)


async def test_denial_returns_the_reason_to_the_model() -> None:
    files, ext = Files(), ConfirmationExtension()
    model = ScriptedModel([tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"), "ok"])
    agent = AgentCore(model, tools=[files.delete_file], extensions=[ext])
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    assert agent.emit_external_event(response("c1", False), config=config) == [NAME]
    rest = await drain(events)
    assert files.deleted == []
    [done] = completed_calls(rest)
    assert done.is_error and "denied by the user" in (done.error or "")
    tool_message = model.requests[1].messages[-1]
    assert isinstance(tool_message, ToolMessage) and tool_message.is_error
    assert "denied by the user" in tool_message.content
    assert_clean(agent, ext)


async def test_custom_question() -> None:
    files = Files()
    ext = ConfirmationExtension(question=lambda call: f"Really remove {call.arguments['path']}?")
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    request = await next_request(events)
    assert request["question"] == "Really remove a.txt?"
    assert agent.emit_external_event(response("c1"), config=config) == [NAME]
    await drain(events)
    assert_clean(agent, ext)


@pytest.mark.parametrize("approved", ["yes", 1, None, 0.0, [True]])
async def test_a_non_boolean_answer_is_refused_and_does_not_use_up_the_request(
    approved: Any,
) -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    assert agent.emit_external_event(response("c1", approved), config=config) == []
    bare = ExternalEvent(CONFIRMATION_RESPONSE, {"tool_call_id": "c1"})
    assert agent.emit_external_event(bare, config=config) == []
    assert ext.is_waiting("s1", "c1")
    assert agent.emit_external_event(response("c1", True), config=config) == [NAME]
    await drain(events)
    assert files.deleted == ["a.txt"]
    assert_clean(agent, ext)


async def test_tools_not_on_ask_are_not_confirmed() -> None:
    @tool(policy="deny")
    def shred(path: str) -> str:
        """Shred a file."""
        raise AssertionError("a denied tool must not run")

    files, ext = Files(), ConfirmationExtension()
    batch = AssistantMessage(
        None, [ToolCall("c1", "list_files", {}), ToolCall("c2", "shred", {"path": "x"})]
    )
    agent = AgentCore(
        ScriptedModel([batch, "done"]), tools=[files.list_files, shred], extensions=[ext]
    )
    events = await drain(agent.stream("go", config=AgentRunConfig(session_id="s1")))
    assert not any(is_request(e) for e in events)
    first, second = completed_calls(events)
    assert not first.is_error and second.is_error
    assert "not allowed by policy" in (second.error or "")
    assert_clean(agent, ext)


async def test_ask_from_the_agent_policy_table() -> None:
    @tool
    def rename(old: str, new: str) -> str:
        """Rename a file."""
        return f"{old} -> {new}"

    ext = ConfirmationExtension()
    agent = AgentCore(
        ScriptedModel([tool_call_turn("rename", {"old": "a", "new": "b"}, call_id="r1"), "ok"]),
        tools=[rename],
        extensions=[ext],
        tool_policies={"ren*": "ask"},
    )
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    request = await next_request(events)
    assert request["tool"] == "rename"
    assert agent.emit_external_event(response("r1"), config=config) == [NAME]
    [done] = completed_calls(await drain(events))
    assert done.result == "a -> b"
    assert_clean(agent, ext)


# -- expiry -------------------------------------------------------------------------------------


async def test_expiry_denies_the_call_and_refuses_a_late_answer() -> None:
    files, ext = Files(), ConfirmationExtension(timeout=0.02)
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    request = await next_request(events)
    rest = await drain(events)  # nobody answers: the request expires by itself
    [done] = completed_calls(rest)
    assert done.is_error and "expired" in (done.error or "")
    assert request["expires_at"] in (done.error or "")
    assert files.deleted == []
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    assert agent.emit_external_event(response("c1"), config=config) == []
    assert_clean(agent, ext)


# -- routing ------------------------------------------------------------------------------------


async def test_request_id_must_match_when_given() -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1", request_id="run-1")
    events = agent.stream("go", config=config)
    await next_request(events)
    wrong = AgentRunConfig(session_id="s1", request_id="run-0")
    assert agent.emit_external_event(response("c1"), config=wrong) == []
    assert agent.emit_external_event(response("c1"), config=AgentRunConfig(session_id="s2")) == []
    assert agent.emit_external_event(response("c1"), config=config) == [NAME]
    await drain(events)
    assert files.deleted == ["a.txt"]
    assert_clean(agent, ext)


async def test_two_sessions_with_the_same_tool_call_id() -> None:
    files, ext = Files(), ConfirmationExtension()
    turn_a = tool_call_turn("delete_file", {"path": "a.txt"}, call_id="same")
    turn_b = tool_call_turn("delete_file", {"path": "b.txt"}, call_id="same")
    agent = confirmation_agent(ext, files, turn_a, turn_b, "one", "two")
    a, b = AgentRunConfig(session_id="a"), AgentRunConfig(session_id="b")
    events_a, events_b = agent.stream("go", config=a), agent.stream("go", config=b)
    assert (await next_request(events_a))["arguments"] == {"path": "a.txt"}
    assert (await next_request(events_b))["arguments"] == {"path": "b.txt"}
    assert agent.emit_external_event(response("same", False), config=a) == [NAME]
    await drain(events_a)
    assert ext.is_waiting("b", "same")
    assert agent.emit_external_event(response("same", True), config=b) == [NAME]
    await drain(events_b)
    assert files.deleted == ["b.txt"]
    assert_clean(agent, ext)


async def test_other_sessions_proceed_while_one_waits() -> None:
    files, ext = Files(), ConfirmationExtension()

    def answer(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if isinstance(last, UserMessage) and last.content == "delete":
            return tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1")
        return "plain answer"

    model = FunctionModel(answer)
    agent = AgentCore(model, tools=[files.delete_file], extensions=[ext])
    waiting = AgentRunConfig(session_id="waiting")
    events = agent.stream("delete", config=waiting)
    await next_request(events)
    for n in range(5):
        reply = await agent.chat("hello", config=AgentRunConfig(session_id=f"other-{n}"))
        assert reply.content == "plain answer"
    assert ext.is_waiting("waiting", "c1")
    assert agent.emit_external_event(response("c1"), config=waiting) == [NAME]
    await drain(events)
    assert_clean(agent, ext)


# -- batches ------------------------------------------------------------------------------------


@pytest.mark.parametrize("parallel", [False, True])
async def test_ask_calls_of_one_batch_are_confirmed_one_after_another(parallel: bool) -> None:
    files, ext = Files(), ConfirmationExtension()
    batch = AssistantMessage(
        None,
        [
            ToolCall("c1", "delete_file", {"path": "a.txt"}),
            ToolCall("c2", "list_files", {}),
            ToolCall("c3", "delete_file", {"path": "b.txt"}),
        ],
    )
    agent = confirmation_agent(ext, files, batch, "done", parallel_tool_calls=parallel)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    seen: list[str] = []
    async for event in events:
        if is_request(event):
            assert event.payload is not None
            call_id = event.payload["tool_call_id"]
            seen.append(f"request {call_id}")
            assert ext.pending_count() == 1 and ext.is_waiting("s1", call_id)
            approved = call_id == "c3"
            assert agent.emit_external_event(response(call_id, approved), config=config) == [NAME]
        elif event.type is AgentEventType.TOOL_CALL_COMPLETED:
            seen.append(f"done {event.tool_call_id}")
    if parallel:  # all checks first, then the calls run together
        assert seen[:2] == ["request c1", "request c3"]
    else:
        assert seen == ["request c1", "done c1", "done c2", "request c3", "done c3"]
    assert files.deleted == ["b.txt"]
    assert_clean(agent, ext)


# -- terminal paths -----------------------------------------------------------------------------


async def test_cancel_while_waiting_then_a_new_run_works() -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(
        ext,
        files,
        tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"),
        tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"),
        "done",
    )
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    run_id = next(iter(agent.active_runs))
    assert agent.cancel_run(run_id)
    with pytest.raises(RunCancelledError):
        await drain(events)
    assert agent.emit_external_event(response("c1"), config=config) == []
    assert_clean(agent, ext)

    events = agent.stream("go again", config=config)
    await next_request(events)
    assert agent.emit_external_event(response("c1"), config=config) == [NAME]
    assert (await drain(events))[-1].type is AgentEventType.RUN_COMPLETED
    assert files.deleted == ["a.txt"]
    assert_clean(agent, ext)


async def test_consumer_leaving_while_waiting_cancels() -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    await events.aclose()  # type: ignore[attr-defined]
    assert agent.state.phase is AgentPhase.CANCELLED
    assert agent.emit_external_event(response("c1"), config=config) == []
    assert_clean(agent, ext)


async def test_run_timeout_while_waiting_then_a_new_run_works() -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(
        ext,
        files,
        tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"),
        tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1"),
        "done",
    )
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config, run_timeout=0.05)
    await next_request(events)
    with pytest.raises(RunError, match="run_timeout"):
        await drain(events)
    assert agent.state.phase is AgentPhase.FAILED
    assert agent.emit_external_event(response("c1"), config=config) == []
    assert_clean(agent, ext)

    events = agent.stream("go", config=config)
    await next_request(events)
    assert agent.emit_external_event(response("c1"), config=config) == [NAME]
    await drain(events)
    assert files.deleted == ["a.txt"]
    assert_clean(agent, ext)


async def test_on_error_while_waiting_fails_the_run() -> None:
    files, ext = Files(), ConfirmationExtension()
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    await ext.on_error(next(iter(agent.active_runs.values())), ConnectionError("store lost"))
    with pytest.raises(ConnectionError, match="store lost"):
        await drain(events)
    assert files.deleted == []
    assert_clean(agent, ext)


# -- races --------------------------------------------------------------------------------------


class Volley:
    """Long-lived worker threads that each run one job per round, released by one barrier.

    Creating 100 threads for every trial would dominate the test's time; these are reused.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._barrier = threading.Barrier(size)
        self._inboxes: list[queue.SimpleQueue[Callable[[], Any] | None]] = [
            queue.SimpleQueue() for _ in range(size)
        ]
        self._lock = threading.Lock()
        self._results: list[Any] = []
        self._remaining = 0
        self._done: asyncio.Future[list[Any]] | None = None
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    async def fire(self, jobs: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run ``jobs[i]`` on thread ``i``, all released at once; their results in order."""
        assert len(jobs) == self.size
        done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._done = done
            self._results = [None] * self.size
            self._remaining = self.size
        for inbox, job in zip(self._inboxes, jobs, strict=True):
            inbox.put(job)
        return await done

    def _work(self, index: int) -> None:
        inbox = self._inboxes[index]
        while True:
            job = inbox.get()
            if job is None:
                return
            self._barrier.wait()
            try:
                result = job()
            except BaseException as exc:  # reported to the test as a result
                result = exc
            with self._lock:
                self._results[index] = result
                self._remaining -= 1
                done = self._done if self._remaining == 0 else None
                results = self._results
            if done is not None:
                done.get_loop().call_soon_threadsafe(_settle, done, results)

    async def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        await asyncio.to_thread(self._join)

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()


def _settle(future: asyncio.Future[list[Any]], results: list[Any]) -> None:
    if not future.done():
        future.set_result(results)


def spin(n: int) -> None:
    """Busy work of random length so the threads' calls interleave differently each trial."""
    for _ in range(n):
        pass


def jitter(seconds: float) -> None:
    """Timing noise: hold this thread back a random moment while the loop keeps running.

    It waits for no state (it is not synchronisation); it yields the CPU and the GIL on every
    turn so the event loop's thread can advance meanwhile, which a plain busy spin would not
    allow for up to the interpreter's switch interval.
    """
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _yield_cpu()


def after_jitter(seconds: float, call: Callable[[], T]) -> T:
    """A job: jitter for ``seconds``, then make the call."""
    jitter(seconds)
    return call()


def answer_job(
    agent: AgentCore, seconds: float, event: ExternalEvent, config: AgentRunConfig
) -> Job:
    return functools.partial(
        after_jitter, seconds, functools.partial(agent.emit_external_event, event, config=config)
    )


def per_trial_model(gate: asyncio.Event | None = None) -> FunctionModel:
    """Calls delete_file once per run, with a call id derived from the prompt (``trial N``).

    With a ``gate``, the model's second call of each run waits until the gate is open.
    """

    async def answer(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if isinstance(last, UserMessage):
            n = last.text.split()[-1]
            return tool_call_turn("delete_file", {"path": f"file-{n}"}, call_id=f"call-{n}")
        if gate is not None:
            await gate.wait()
        return "done"

    return FunctionModel(answer)


def send_all(
    agent: AgentCore, plan: Sequence[tuple[int, ExternalEvent, AgentRunConfig, int]]
) -> dict[int, list[str]]:
    """One thread's share of a round: each answer after its own spin, results by trial slot."""
    verdicts: dict[int, list[str]] = {}
    for slot, event, config, n in plan:
        spin(n)
        verdicts[slot] = agent.emit_external_event(event, config=config)
    return verdicts


async def test_hundred_threads_answering_at_once_exactly_one_is_accepted() -> None:
    """1,000 trials; in each, 100 threads send answers to one waiting call at the same moment.

    To stay fast, a round runs ten trials side by side (ten sessions waiting at once) and the
    same 100 threads answer all ten, each in its own random order and with random delays.
    Roughly a third of the sends are near misses (malformed, wrong session, wrong request,
    wrong call, wrong name) that must all be refused without using up the wait.
    """
    rounds, side_by_side, threads = 100, 10, 100
    rng = random.Random(20261130)
    ext = ConfirmationExtension()
    deleted: list[str] = []

    @tool(policy="ask")
    async def delete_file(path: str) -> str:
        """Delete a file (async: no executor threads join the crowd)."""
        deleted.append(path)
        return f"Deleted {path}"

    # While 100 threads compete for the GIL, a loop step can be preempted for long enough to
    # trip the blocked-loop check. The gate parks each woken run until the round's threads
    # are done, so the loop has little to do meanwhile.
    gate = asyncio.Event()
    agent = AgentCore(per_trial_model(gate), tools=[delete_file], extensions=[ext])
    volley = Volley(threads)
    approvals = 0
    trials = 0
    try:
        for round_no in range(rounds):
            streams: list[AsyncIterator[AgentEvent]] = []
            goods: list[tuple[ExternalEvent, AgentRunConfig]] = []
            noises: list[list[tuple[ExternalEvent, AgentRunConfig]]] = []
            approved: list[bool] = []
            for slot in range(side_by_side):
                n = round_no * side_by_side + slot
                config = AgentRunConfig(session_id=f"race-{slot}", request_id=f"req-{n}")
                events = agent.stream(f"trial {n}", config=config)
                streams.append(events)
                request = await next_request(events)
                call_id = request["tool_call_id"]
                assert call_id == f"call-{n}"
                approved.append(rng.random() < 0.5)
                good = response(call_id, approved[-1], note=n)
                goods.append((good, config))
                neighbour = AgentRunConfig(session_id=f"race-{(slot + 1) % side_by_side}")
                noises.append(
                    [
                        (response(call_id, "yes"), config),
                        (response(call_id, approved[-1]), AgentRunConfig(session_id="nobody")),
                        (response(call_id, approved[-1]), neighbour),
                        (response(call_id, True), AgentRunConfig(f"race-{slot}", f"req-{n - 1}")),
                        (response(f"call-{n - 1}", approved[-1]), config),
                        (ExternalEvent("something_else", dict(good.payload)), config),
                    ]
                )
            real = [[rng.random() < 0.7 for _ in range(side_by_side)] for _ in range(threads)]
            for slot in range(side_by_side):
                real[rng.randrange(threads)][slot] = True  # at least one real answer each
            jobs: list[Job] = []
            for row in real:
                plan = [
                    (slot, *(goods[slot] if row[slot] else rng.choice(noises[slot])))
                    for slot in range(side_by_side)
                ]
                rng.shuffle(plan)
                jobs.append(
                    functools.partial(
                        send_all, agent, [(*item, rng.randrange(300)) for item in plan]
                    )
                )
            gate.clear()
            results = await volley.fire(jobs)
            gate.set()
            for result in results:
                assert not isinstance(result, BaseException), result
            for slot in range(side_by_side):
                verdicts = [
                    (row[slot], result[slot]) for row, result in zip(real, results, strict=True)
                ]
                accepted = [v for is_real, v in verdicts if is_real and v]
                assert accepted == [[NAME]], f"round {round_no} slot {slot}: {accepted}"
                assert all(v == [] for is_real, v in verdicts if not is_real)
            for slot, events in enumerate(streams):
                rest = await drain(events)
                [done] = completed_calls(rest)
                assert done.is_error is (not approved[slot])
                assert rest[-1].type is AgentEventType.RUN_COMPLETED
                approvals += approved[slot]
                trials += 1
            assert_clean(agent, ext)
    finally:
        await volley.close()
    assert trials == 1000
    assert len(deleted) == approvals
    assert len(set(deleted)) == approvals  # no trial's tool ran twice


async def test_answer_racing_cancellation() -> None:
    trials = 300
    rng = random.Random(7)
    files, ext = Files(), ConfirmationExtension()
    agent = AgentCore(per_trial_model(), tools=[files.delete_file], extensions=[ext])
    volley = Volley(2)
    outcomes: dict[str, int] = {}
    try:
        for trial in range(trials):
            config = AgentRunConfig(session_id="race", request_id=f"req-{trial}")
            events = agent.stream(f"trial {trial}", config=config)
            request = await next_request(events)
            run_id = next(iter(agent.active_runs))
            loop = asyncio.get_running_loop()
            good = response(request["tool_call_id"], True)
            cancel = functools.partial(loop.call_soon_threadsafe, agent.cancel_run, run_id)
            jobs: list[Job] = [
                functools.partial(after_jitter, rng.uniform(0, 0.0003), cancel),
                answer_job(agent, rng.uniform(0, 0.001), good, config),
            ]
            _, verdict = await volley.fire(jobs)
            try:
                rest = await drain(events)
            except RunCancelledError:
                outcome = "cancelled"
            else:
                assert rest[-1].type is AgentEventType.RUN_COMPLETED
                outcome = "completed"
            ran = f"file-{trial}" in files.deleted
            if verdict == []:
                assert not ran and outcome == "cancelled"
            else:
                assert verdict == [NAME]
            if outcome == "completed":
                assert ran
            key = (
                f"{outcome}, {'accepted' if verdict else 'refused'}, {'ran' if ran else 'not run'}"
            )
            outcomes[key] = outcomes.get(key, 0) + 1
            assert_clean(agent, ext)
    finally:
        await volley.close()
    assert len(files.deleted) == len(set(files.deleted))
    print("cancellation race outcomes:", outcomes)


async def test_answer_racing_expiry() -> None:
    trials = 300
    rng = random.Random(11)
    files = Files()
    ext = ConfirmationExtension(timeout=0.002)
    agent = AgentCore(per_trial_model(), tools=[files.delete_file], extensions=[ext])
    volley = Volley(1)
    outcomes = {"approved in time": 0, "expired": 0}
    try:
        for trial in range(trials):
            config = AgentRunConfig(session_id="race")
            events = agent.stream(f"trial {trial}", config=config)
            request = await next_request(events)
            good = response(request["tool_call_id"], True)
            job = answer_job(agent, rng.uniform(0, 0.004), good, config)
            [verdict] = await volley.fire([job])
            rest = await drain(events)
            [done] = completed_calls(rest)
            ran = f"file-{trial}" in files.deleted
            # whatever the timing, the answer's acceptance and the call's fate agree
            if verdict == [NAME]:
                assert ran and not done.is_error
                outcomes["approved in time"] += 1
            else:
                assert verdict == []
                assert not ran and "expired" in (done.error or "")
                outcomes["expired"] += 1
            assert_clean(agent, ext)
    finally:
        await volley.close()
    print("expiry race outcomes:", outcomes)


async def test_answer_delivered_after_expiry_is_refused_deterministically() -> None:
    files, ext = Files(), ConfirmationExtension(timeout=0.01)
    agent = confirmation_agent(ext, files)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await next_request(events)
    async for event in events:
        if event.type is AgentEventType.TOOL_CALL_COMPLETED:
            # the call was already denied: the answer must not be accepted
            verdict = await asyncio.to_thread(
                agent.emit_external_event, response("c1"), config=config
            )
            assert verdict == []
    assert files.deleted == []
    assert_clean(agent, ext)


# -- the documentation example ------------------------------------------------------------------


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_example_confirmation", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_example_main(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs in this test's loop, debug checks on; tests/test_docs_examples.py runs the script."""
    module = load_example()
    await module.main()
    out = capsys.readouterr().out
    assert "confirmation_requested" in out
    assert "accepted by ['ConfirmationExtension']" in out
    assert "second answer accepted by []" in out
