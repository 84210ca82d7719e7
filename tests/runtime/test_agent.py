"""AgentCore: the run loop, events, sessions, deadlines, lifecycle and loop affinity."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from agent_runtime import (
    AgentClosedError,
    AgentCore,
    AgentEvent,
    AgentEventType,
    AgentPhase,
    AgentRunConfig,
    AssistantMessage,
    ConfigurationError,
    InMemoryConversationStore,
    LoopAffinityError,
    MaxIterationsError,
    ProviderError,
    RunCancelledError,
    RunTimeoutError,
    SessionBusyError,
    ToolCall,
    tool,
)
from agent_runtime.messages import Message, ToolMessage, UserMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn


async def collect(agent: AgentCore, prompt: str, **options: object) -> list[AgentEvent]:
    return [event async for event in agent.stream(prompt, **options)]  # type: ignore[arg-type]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Gate:
    """A model whose stream waits on an event the test controls."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.retry = RetryOptions(max_retries=0)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield ModelEvent.text("waiting")
        self.entered.set()
        await self.release.wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage("waiting done")))


async def test_text_run_streams_ordered_events() -> None:
    agent = AgentCore(ScriptedModel(["Hello there world"]))
    events = await collect(agent, "hi", config=AgentRunConfig(session_id="s1"))
    types = [e.type for e in events]
    assert types[0] is AgentEventType.RUN_STARTED
    assert types[-1] is AgentEventType.RUN_COMPLETED
    assert [e.delta for e in events if e.type is AgentEventType.TEXT_DELTA] == [
        "Hello ",
        "there ",
        "world",
    ]
    run_ids = {e.run_id for e in events}
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("run_")
    assert {e.session_id for e in events} == {"s1"}
    call_ids = {e.model_call_id for e in events if e.type is AgentEventType.TEXT_DELTA}
    usage = [e for e in events if e.type is AgentEventType.USAGE]
    assert len(call_ids) == 1 and usage[0].model_call_id in call_ids
    assert events[-1].data()["output"] == {"content": "Hello there world"}
    assert agent.state.phase is AgentPhase.COMPLETED
    assert not agent.active_runs and not agent.active_sessions


async def test_tool_round_trip_and_chat_response() -> None:
    model = ScriptedModel([tool_call_turn("add", {"a": 2, "b": 3}), "five"])
    agent = AgentCore(model, tools=[add])
    response = await agent.chat("add them", config=AgentRunConfig(session_id="s", run_id="run-1"))
    assert response.content == "five"
    assert response.run_id == "run-1" and response.session_id == "s"
    second = model.requests[1].messages
    assert isinstance(second[-1], ToolMessage) and second[-1].content == "5"
    assert [type(m).__name__ for m in response.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "AssistantMessage",
    ]
    assert response.usage.output_tokens > 0
    model.assert_consumed()


async def test_tool_events_carry_call_details() -> None:
    agent = AgentCore(ScriptedModel([tool_call_turn("add", {"a": 1, "b": 1}), "two"]), tools=[add])
    events = await collect(agent, "go")
    started = next(e for e in events if e.type is AgentEventType.TOOL_CALL_STARTED)
    done = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert started.data() == {
        "tool_call_id": "call_add",
        "name": "add",
        "arguments": {"a": 1, "b": 1},
    }
    assert done.data() == {
        "tool_call_id": "call_add",
        "name": "add",
        "is_error": False,
        "result": 2,
    }


async def test_model_sees_system_prompt_tools_and_history() -> None:
    model = ScriptedModel(["ok"])
    agent = AgentCore(model, tools=[add], system_prompt="be brief")
    history: list[Message] = [UserMessage("earlier"), AssistantMessage("reply")]
    await agent.chat("now", conversation=history)
    request = model.requests[0]
    assert request.system == "be brief"
    assert [t.name for t in request.tools] == ["add"]
    assert [m.content for m in request.messages] == ["earlier", "reply", "now"]
    assert len(history) == 2  # the caller's list is not modified


async def test_conversation_store_keeps_history_per_session() -> None:
    store = InMemoryConversationStore()
    model = ScriptedModel(["first", "second", "other"])
    agent = AgentCore(model, conversation_store=store)
    await agent.chat("one", config=AgentRunConfig(session_id="a"))
    await agent.chat("two", config=AgentRunConfig(session_id="a"))
    await agent.chat("three", config=AgentRunConfig(session_id="b"))
    assert [m.content for m in model.requests[1].messages] == ["one", "first", "two"]
    assert [m.content for m in model.requests[2].messages] == ["three"]
    assert len(await store.load("a")) == 4


async def test_failed_run_does_not_write_the_conversation() -> None:
    store = InMemoryConversationStore()
    agent = AgentCore(ScriptedModel([ProviderError("boom")]), conversation_store=store)
    with pytest.raises(ProviderError):
        await agent.chat("x", config=AgentRunConfig(session_id="a"))
    assert await store.load("a") == []


async def test_failure_yields_run_failed_then_raises() -> None:
    agent = AgentCore(ScriptedModel([ProviderError("upstream broke", status_code=400)]))
    seen: list[AgentEvent] = []
    with pytest.raises(ProviderError) as info:
        async for event in agent.stream("x"):
            seen.append(event)
    assert seen[-1].type is AgentEventType.RUN_FAILED
    assert seen[-1].data()["error"] == {"code": "provider_error", "message": "upstream broke"}
    assert info.value.run_id == seen[-1].run_id
    assert agent.state.phase is AgentPhase.FAILED


async def test_retry_options_are_honoured() -> None:
    calls: list[int] = []

    def answer(request: ModelRequest) -> object:
        calls.append(1)
        if len(calls) < 3:
            return ProviderError("busy", retryable=True, status_code=503)
        return "finally"

    model = FunctionModel(answer, retry=RetryOptions(max_retries=2, initial_delay=0))
    assert (await AgentCore(model).chat("x")).content == "finally"
    assert len(calls) == 3


async def test_retries_exhausted_raise_the_provider_error() -> None:
    model = ScriptedModel(
        [ProviderError("busy", retryable=True)] * 2,
        retry=RetryOptions(max_retries=1, initial_delay=0),
    )
    with pytest.raises(ProviderError, match="busy"):
        await AgentCore(model).chat("x")
    model.assert_consumed()


async def test_max_iterations_bounds_the_loop() -> None:
    model = ScriptedModel(
        [tool_call_turn("add", {"a": 1, "b": 1}, call_id=f"c{i}") for i in range(3)]
    )
    agent = AgentCore(model, tools=[add], max_iterations=3)
    with pytest.raises(MaxIterationsError) as info:
        await agent.chat("loop")
    assert info.value.code == "max_iterations"
    model.assert_consumed()


async def test_session_busy_and_parallel_sessions() -> None:
    gate = Gate()
    agent = AgentCore(gate)
    first = agent.stream("a", config=AgentRunConfig(session_id="same"))
    assert (await anext(first)).type is AgentEventType.RUN_STARTED
    await gate.entered.wait()
    with pytest.raises(SessionBusyError) as info:
        await agent.chat("b", config=AgentRunConfig(session_id="same"))
    assert info.value.active_run_id in agent.active_runs
    # another session is not held up by the waiting one
    other = AgentCore(ScriptedModel(["free"]))
    assert (await other.chat("c", config=AgentRunConfig(session_id="other"))).content == "free"
    gate.release.set()
    rest = [e async for e in first]
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    assert not agent.active_sessions


async def test_closing_the_stream_cancels_the_run() -> None:
    gate = Gate()
    agent = AgentCore(gate)
    async with aclosing(agent.stream("x")) as events:  # type: ignore[type-var]
        async for event in events:
            if event.type is AgentEventType.TEXT_DELTA:
                break
    assert agent.state.phase is AgentPhase.CANCELLED
    assert not agent.active_runs and not agent.active_sessions


async def test_a_run_that_finished_producing_is_still_cancelled_by_an_early_close() -> None:
    # the model has produced everything, but the consumer leaves before the terminal event
    agent = AgentCore(ScriptedModel(["a b c"]))
    async with aclosing(agent.stream("x")) as events:  # type: ignore[type-var]
        async for event in events:
            if event.type is AgentEventType.TEXT_DELTA:
                break
    assert agent.state.phase is AgentPhase.CANCELLED


async def test_outside_cancellation_propagates() -> None:
    gate = Gate()
    agent = AgentCore(gate)

    async def consume() -> None:
        async for _ in agent.stream("x"):
            pass

    task = asyncio.create_task(consume())
    await gate.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert agent.state.phase is AgentPhase.CANCELLED
    assert not agent.active_runs


async def test_cancel_run_ends_with_run_cancelled() -> None:
    gate = Gate()
    agent = AgentCore(gate)
    stream = agent.stream("x", config=AgentRunConfig(session_id="s", run_id="r1"))
    seen = [await anext(stream)]
    await gate.entered.wait()
    assert agent.cancel_run("r1", "cancel_requested")
    with pytest.raises(RunCancelledError) as info:
        async for event in stream:
            seen.append(event)
    assert info.value.reason == "cancel_requested"
    assert seen[-1].type is AgentEventType.RUN_CANCELLED
    assert seen[-1].data() == {"reason": "cancel_requested"}
    assert not agent.cancel_run("r1")


async def test_run_timeout_bounds_the_whole_run() -> None:
    gate = Gate()
    agent = AgentCore(gate, run_timeout=0.05)
    with pytest.raises(RunTimeoutError) as info:
        await agent.chat("x", config=AgentRunConfig(run_id="r-timeout"))
    assert isinstance(info.value, TimeoutError)
    assert info.value.timeout == 0.05 and info.value.run_id == "r-timeout"
    assert info.value.code == "run_timeout"
    assert agent.state.phase is AgentPhase.FAILED


async def test_run_timeout_counts_time_the_consumer_spends_between_pulls() -> None:
    agent = AgentCore(ScriptedModel(["one two three four"]), run_timeout=0.2)
    stream = agent.stream("x")
    await anext(stream)  # the clock starts at the first pull
    await asyncio.sleep(0.3)  # a consumer parked longer than the budget
    with pytest.raises(RunTimeoutError):
        async for _ in stream:
            pass


async def test_per_call_run_timeout_override_and_none() -> None:
    agent = AgentCore(ScriptedModel(["fine"]), run_timeout=0.01)
    assert (await agent.chat("x", run_timeout=None)).content == "fine"
    with pytest.raises(ConfigurationError):
        await agent.chat("x", run_timeout=-1)


async def test_unknown_run_option_is_rejected() -> None:
    agent = AgentCore(ScriptedModel([]))
    with pytest.raises(ConfigurationError, match="unknown run option"):
        await agent.chat("x", temperature=0.2)  # type: ignore[call-arg]


async def test_aclose_is_idempotent_single_flight_and_final() -> None:
    gate = Gate()
    agent = AgentCore(gate)
    stream = agent.stream("x")
    await anext(stream)
    await gate.entered.wait()
    await asyncio.gather(agent.aclose(), agent.aclose(), agent.aclose())
    await agent.aclose()
    assert agent.closed and not agent.active_runs
    assert agent.state.phase is AgentPhase.CANCELLED
    with pytest.raises(RunCancelledError, match="shutdown"):
        async for _ in stream:
            pass
    with pytest.raises(AgentClosedError):
        agent.stream("again")
    with pytest.raises(AgentClosedError):
        await agent.chat("again")
    with pytest.raises(RuntimeError):
        await agent.arefresh_credentials()
    from agent_runtime.extensions.external import ExternalEvent

    with pytest.raises(RuntimeError):
        agent.emit_external_event(ExternalEvent("x", {}))


async def test_open_closes_the_agent() -> None:
    async with AgentCore.open(ScriptedModel(["hi"])) as agent:
        assert (await agent.chat("x")).content == "hi"
    assert agent.closed


async def test_create_claims_the_loop_and_a_second_loop_is_refused() -> None:
    agent = await AgentCore.create(ScriptedModel(["hi"]))
    errors: list[BaseException] = []

    def other_thread() -> None:
        async def use() -> None:
            await agent.chat("x")

        try:
            asyncio.run(use())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert len(errors) == 1 and isinstance(errors[0], LoopAffinityError)
    assert errors[0].owner_loop is asyncio.get_running_loop()
    assert errors[0].current_loop is not None
    assert errors[0].current_loop is not errors[0].owner_loop


async def test_agent_state_is_the_latest_and_context_has_its_own() -> None:
    gate = Gate()
    agent = AgentCore(gate)
    stream = agent.stream("x", config=AgentRunConfig(session_id="one"))
    await anext(stream)
    await gate.entered.wait()
    first_state = agent.state
    context = next(iter(agent.active_runs.values()))
    assert context.state is first_state and context.phase is AgentPhase.MODEL
    assert context == context and context != object()
    assert {context: 1}[context] == 1
    gate.release.set()
    async for _ in stream:
        pass
    other = AgentCore(ScriptedModel(["x"]))
    await other.chat("y")
    assert first_state.phase is AgentPhase.COMPLETED


async def test_model_must_end_with_completed() -> None:
    async def stream(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield ModelEvent.text("no end")

    with pytest.raises(ProviderError, match="without a completed event"):
        await AgentCore(FunctionModel(stream)).chat("x")


async def test_not_a_model_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="not a model"):
        AgentCore(object())  # type: ignore[arg-type]


async def test_usage_is_summed_over_model_calls() -> None:
    turns = [
        ModelResponse(
            AssistantMessage(None, [ToolCall("c1", "add", {"a": 1, "b": 2})]), Usage(10, 1)
        ),
        ModelResponse(AssistantMessage("3"), Usage(20, 2)),
    ]
    response = await AgentCore(ScriptedModel(turns), tools=[add]).chat("x")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (30, 3)
