"""Extensions: hooks, ordering, registration errors, and cleanup on every terminal path.

Covers the checklist for shipping an extension: success and tool error, failure before the
extension's state exists, cancellation while streaming and while waiting, two sessions on one
instance, a second request after each outcome, and registration collisions and ordering.
(Duplicate and late external replies are covered with the external-event extension.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    AgentExtension,
    AgentPhase,
    AgentRunConfig,
    AgentRunContext,
    AssistantMessage,
    ConfigurationError,
    ProviderError,
    ToolCall,
    tool,
)
from agent_runtime.extensions.base import ToolOutcome
from agent_runtime.extensions.events import ExtensionEvent, RunCancelledEvent
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn


class Tracker(AgentExtension):
    """Keeps request-local state keyed by context and records every hook call."""

    def __init__(self, name: str | None = None, priority: int = 0) -> None:
        self._name = name
        self.priority = priority
        self.active: dict[AgentRunContext, list[str]] = {}
        self.log: list[str] = []
        self.cancel_reasons: list[str] = []
        self.errors: list[Exception] = []

    @property
    def name(self) -> str:
        return self._name or super().name

    async def before_run(self, context: AgentRunContext) -> None:
        self.log.append(f"{self.name}:before_run")
        self.active[context] = []

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        self.active[context].append(call.name)
        self.log.append(f"{self.name}:before_tool:{call.name}")

    async def after_tool(
        self, context: AgentRunContext, call: ToolCall, outcome: ToolOutcome
    ) -> None:
        self.log.append(
            f"{self.name}:after_tool:{call.name}:{'error' if outcome.is_error else 'ok'}"
        )

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        if isinstance(event, RunCancelledEvent):
            self.cancel_reasons.append(event.reason)
            self.active.pop(context, None)

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self.log.append(f"{self.name}:on_success")
        self.active.pop(context, None)

    async def on_error(self, context: AgentRunContext, error: Exception) -> None:
        self.errors.append(error)
        # tolerant: the run may have failed before before_run ran for this extension
        self.active.pop(context, None)


@tool
def echo(text: str) -> str:
    """Echo text."""
    return text


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("tool broke")


async def test_success_and_a_normal_tool_error() -> None:
    tracker = Tracker()
    model = ScriptedModel(
        [tool_call_turn("explode"), tool_call_turn("echo", {"text": "hi"}), "done"]
    )
    agent = AgentCore(model, tools=[echo, explode], extensions=[tracker])
    assert (await agent.chat("x")).content == "done"
    assert tracker.log == [
        "Tracker:before_run",
        "Tracker:before_tool:explode",
        "Tracker:after_tool:explode:error",
        "Tracker:before_tool:echo",
        "Tracker:after_tool:echo:ok",
        "Tracker:on_success",
    ]
    assert not tracker.active and not tracker.errors


async def test_failure_before_the_extension_initialised_its_state() -> None:
    class FailsFirst(AgentExtension):
        priority = 10

        async def before_run(self, context: AgentRunContext) -> None:
            raise RuntimeError("setup failed")

    tracker = Tracker()
    agent = AgentCore(ScriptedModel(["never"]), extensions=[tracker, FailsFirst()])
    with pytest.raises(RuntimeError, match="setup failed"):
        await agent.chat("x")
    assert tracker.log == []  # its before_run never ran...
    assert len(tracker.errors) == 1  # ...yet its cleanup ran, tolerantly
    assert not tracker.active
    assert agent.state.phase is AgentPhase.FAILED


async def test_cancellation_during_model_streaming() -> None:
    tracker = Tracker()
    release = asyncio.Event()

    async def stream(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield ModelEvent.text("partial")
        await release.wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage("partial")))

    agent = AgentCore(FunctionModel(stream), extensions=[tracker])
    async with aclosing(agent.stream("x")) as events:  # type: ignore[type-var]
        async for event in events:
            if event.type is AgentEventType.TEXT_DELTA:
                break
    assert tracker.cancel_reasons == ["consumer_closed"]
    assert not tracker.errors and not tracker.active
    assert agent.state.phase is AgentPhase.CANCELLED


async def test_cancellation_while_a_tool_waits_for_outside_input() -> None:
    tracker = Tracker()
    waiting = asyncio.Event()

    @tool
    async def wait_for_human() -> str:
        """Blocks until someone answers."""
        waiting.set()
        await asyncio.Event().wait()
        return "never"

    agent = AgentCore(
        ScriptedModel([tool_call_turn("wait_for_human")]),
        tools=[wait_for_human],
        extensions=[tracker],
    )
    task = asyncio.create_task(agent.chat("x", config=AgentRunConfig(run_id="r")))
    await waiting.wait()
    agent.cancel_run("r", "cancel_requested")
    with pytest.raises(Exception, match="cancel_requested"):
        await task
    assert tracker.cancel_reasons == ["cancel_requested"]
    assert not tracker.active and not agent.active_runs


async def test_two_sessions_share_one_extension_instance() -> None:
    tracker = Tracker()
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}
    entered = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def stream(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        session = request.session_id or ""
        entered[session].set()
        await gates[session].wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage(f"answer {session}")))

    agent = AgentCore(FunctionModel(stream), extensions=[tracker])
    run_a = asyncio.create_task(agent.chat("x", config=AgentRunConfig(session_id="a")))
    run_b = asyncio.create_task(agent.chat("x", config=AgentRunConfig(session_id="b")))
    await entered["a"].wait()
    await entered["b"].wait()
    contexts = list(tracker.active)
    assert len(contexts) == 2 and {c.session_id for c in contexts} == {"a", "b"}
    # the most recently prepared state is not the way to find one's own request
    assert agent.state in {c.state for c in contexts}
    gates["b"].set()
    assert (await run_b).content == "answer b"
    assert [c.session_id for c in tracker.active] == ["a"]
    gates["a"].set()
    assert (await run_a).content == "answer a"
    assert not tracker.active


@pytest.mark.parametrize("first", ["success", "failure", "cancellation"])
async def test_a_second_request_after_each_outcome(first: str) -> None:
    tracker = Tracker()
    release = asyncio.Event()

    async def first_turn(request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if first == "failure":
            raise ProviderError("down")
        yield ModelEvent.text("one")
        if first == "cancellation":
            await release.wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage("one")))

    def second_turn(request: ModelRequest) -> str:
        return "two"

    turns: Iterator[Callable[[ModelRequest], object]] = iter([first_turn, second_turn])

    def dispatch(request: ModelRequest) -> object:
        return next(turns)(request)

    agent = AgentCore(FunctionModel(dispatch), extensions=[tracker])
    config = AgentRunConfig(session_id="same")
    if first == "cancellation":
        async with aclosing(agent.stream("x", config=config)) as events:  # type: ignore[type-var]
            async for event in events:
                if event.type is AgentEventType.TEXT_DELTA:
                    break
    elif first == "failure":
        with pytest.raises(ProviderError):
            await agent.chat("x", config=config)
    else:
        await agent.chat("x", config=config)
    assert not tracker.active
    response = await agent.chat("again", config=config)
    assert response.content == "two"
    assert agent.state.phase is AgentPhase.COMPLETED and not tracker.active


def test_duplicate_extension_names_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        AgentCore(ScriptedModel([]), extensions=[Tracker(), Tracker()])
    AgentCore(ScriptedModel([]), extensions=[Tracker("one"), Tracker("two")])


def test_tool_name_collisions_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        AgentCore(ScriptedModel([]), tools=[echo, echo])


async def test_run_scoped_tool_colliding_with_an_agent_tool_fails_the_run() -> None:
    class Registers(AgentExtension):
        async def on_tool(self, context: AgentRunContext) -> None:
            context.register_tool(echo)

    agent = AgentCore(ScriptedModel([]), tools=[echo], extensions=[Registers()])
    with pytest.raises(ConfigurationError, match="already registered for this run"):
        await agent.chat("x")


async def test_run_scoped_tools_exist_only_in_their_run() -> None:
    @tool
    def secret() -> str:
        """Only for this run."""
        return "s"

    class Registers(AgentExtension):
        async def on_tool(self, context: AgentRunContext) -> None:
            context.register_tool(secret)

    model = ScriptedModel([tool_call_turn("secret"), "ok"])
    agent = AgentCore(model, extensions=[Registers()])
    await agent.chat("x")
    assert [t.name for t in model.requests[0].tools] == ["secret"]
    assert "secret" not in agent.registry


async def test_equal_priorities_keep_registration_order() -> None:
    order: list[str] = []

    class Named(AgentExtension):
        def __init__(self, label: str, priority: int = 0) -> None:
            self.label = label
            self.priority = priority

        @property
        def name(self) -> str:
            return self.label

        async def before_run(self, context: AgentRunContext) -> None:
            order.append(self.label)

    extensions = [Named("a"), Named("b"), Named("high", 5), Named("c"), Named("low", -1)]
    agent = AgentCore(ScriptedModel(["x"]), extensions=extensions)
    await agent.chat("x")
    assert order == ["high", "a", "b", "c", "low"]
    assert [e.name for e in agent.extensions] == order


async def test_extensions_can_emit_custom_events() -> None:
    class Announcer(AgentExtension):
        async def before_run(self, context: AgentRunContext) -> None:
            await context.emit(AgentEvent(AgentEventType.CUSTOM, name="hello", payload={"n": 1}))

    events = [
        e async for e in AgentCore(ScriptedModel(["x"]), extensions=[Announcer()]).stream("x")
    ]
    custom = next(e for e in events if e.type is AgentEventType.CUSTOM)
    assert custom.data() == {"name": "hello", "payload": {"n": 1}}
    assert custom.run_id == events[0].run_id and custom.session_id == events[0].session_id


async def test_a_failing_cleanup_hook_does_not_stop_the_others() -> None:
    class BadCleanup(AgentExtension):
        priority = 1

        async def on_error(self, context: AgentRunContext, error: Exception) -> None:
            raise RuntimeError("cleanup bug")

    tracker = Tracker()
    agent = AgentCore(ScriptedModel([ProviderError("x")]), extensions=[BadCleanup(), tracker])
    with pytest.raises(ProviderError):
        await agent.chat("x")
    assert len(tracker.errors) == 1 and not tracker.active
