"""What a run leaves to record its turn: the messages of a cancelled run, the approval on a
confirmed call's result, and the model that answered on every usage figure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agent_runtime import AgentCore, AgentEvent, AgentEventType, AgentRunConfig, tool
from agent_runtime.agent import CANCELLED_CALL
from agent_runtime.errors import RunCancelledError
from agent_runtime.extensions.confirmation import CONFIRMATION_RESPONSE, ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.messages import (
    AssistantMessage,
    ToolMessage,
    UserMessage,
    message_from_dict,
    message_to_dict,
)
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn


class Halting:
    """Streams ``words``, then waits until the test lets it go on (it never does)."""

    def __init__(self, *words: str, model_name: str = "halting") -> None:
        self.words = words
        self.streamed = asyncio.Event()
        self.retry = RetryOptions(max_retries=0)
        self.model_name = model_name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        for word in self.words:
            yield ModelEvent.text(word)
        self.streamed.set()
        await asyncio.Event().wait()
        yield ModelEvent.completed(ModelResponse(AssistantMessage("never")))  # pragma: no cover


async def cancelled_run(agent: AgentCore, started: asyncio.Event, run_id: str) -> AgentEvent:
    """Run ``agent`` until ``started``, cancel the run, and return its ``run.cancelled``."""
    seen: list[AgentEvent] = []

    async def consume() -> None:
        config = AgentRunConfig(session_id=f"s-{run_id}", run_id=run_id)
        try:
            async for event in agent.stream("tell me", config=config):
                seen.append(event)
        except RunCancelledError:
            pass

    task = asyncio.create_task(consume())
    await started.wait()  # every word was handed to the run before the model halted
    assert agent.cancel_run(run_id, "cancel_requested")
    await task
    assert seen[-1].type is AgentEventType.RUN_CANCELLED
    return seen[-1]


async def test_a_cancelled_run_carries_its_prompt_and_partial_text() -> None:
    model = Halting("Once ", "upon ")
    agent = AgentCore(model)
    end = await cancelled_run(agent, model.streamed, "r-partial")
    assert end.messages == [UserMessage("tell me"), AssistantMessage("Once upon ")]
    assert end.data() == {"reason": "cancel_requested"}  # the wire form is unchanged


async def test_a_tool_call_cut_short_gets_an_error_result() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Never returns on its own."""
        started.set()
        await release.wait()
        return "late"  # pragma: no cover

    model = ScriptedModel([tool_call_turn("wait_forever", call_id="c1")])
    agent = AgentCore(model, tools=[wait_forever])
    seen: list[AgentEvent] = []

    async def consume() -> None:
        config = AgentRunConfig(session_id="s", run_id="r-tool")
        try:
            async for event in agent.stream("look it up", config=config):
                seen.append(event)
        except RunCancelledError:
            pass

    task = asyncio.create_task(consume())
    await started.wait()
    assert agent.cancel_run("r-tool", "cancel_requested")
    await task
    end = seen[-1]
    assert end.type is AgentEventType.RUN_CANCELLED
    assert end.messages == [
        UserMessage("look it up"),
        AssistantMessage(None, [tool_call_turn("wait_forever", call_id="c1").tool_calls[0]]),
        ToolMessage("c1", "wait_forever", f"Error: {CANCELLED_CALL}", True),
    ]


async def test_a_cancelled_run_after_a_finished_call_keeps_its_result() -> None:
    @tool
    def lookup() -> str:
        """Look something up."""
        return "found it"

    halting = Halting("It ", "says ")
    calls = 0

    def answer(request: ModelRequest) -> AsyncIterator[ModelEvent] | AssistantMessage:
        nonlocal calls
        calls += 1
        return tool_call_turn("lookup", call_id="c1") if calls == 1 else halting.stream(request)

    agent = AgentCore(FunctionModel(answer), tools=[lookup])
    end = await cancelled_run(agent, halting.streamed, "r-after-tool")
    assert end.messages is not None
    assert [message_to_dict(m) for m in end.messages] == [
        {"role": "user", "content": "tell me"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "lookup",
            "content": "found it",
            "is_error": False,
        },
        {"role": "assistant", "content": "It says "},
    ]


async def test_a_confirmed_call_records_the_decision() -> None:
    deleted: list[str] = []

    @tool(policy="ask")
    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"Deleted {path}"

    ext = ConfirmationExtension(timeout=60)
    model = ScriptedModel(
        [
            tool_call_turn("delete_file", {"path": "a"}, call_id="c1"),
            tool_call_turn("delete_file", {"path": "b"}, call_id="c2"),
            "done",
        ]
    )
    agent = AgentCore(model, tools=[delete_file], extensions=[ext])
    config = AgentRunConfig(session_id="s-approve")
    answers = iter([True, False])
    messages: list[object] = []
    async for event in agent.stream("delete a and b", config=config):
        if event.type is AgentEventType.CUSTOM and event.name == "confirmation_requested":
            assert event.payload is not None
            payload = {"tool_call_id": event.payload["tool_call_id"], "approved": next(answers)}
            agent.emit_external_event(ExternalEvent(CONFIRMATION_RESPONSE, payload), config=config)
        if event.type is AgentEventType.RUN_COMPLETED:
            messages = list(event.messages or ())
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.approval, m.is_error) for m in results] == [
        ("c1", "approved", False),
        ("c2", "denied", True),
    ]
    assert deleted == ["a"]
    stored = message_to_dict(results[0])
    assert stored["approval"] == "approved"
    assert message_from_dict(stored) == results[0]
    # a call that needed no approval says nothing about one
    plain = ToolMessage("c3", "x", "ok")
    assert "approval" not in message_to_dict(plain)
    odd = message_from_dict({**message_to_dict(plain), "approval": "maybe"})
    assert isinstance(odd, ToolMessage) and odd.approval is None


async def test_usage_names_the_model_that_answered() -> None:
    agent = AgentCore(ScriptedModel(["one two"], model_name="scripted-a"))
    events = [e async for e in agent.stream("hi")]
    usage = next(e for e in events if e.type is AgentEventType.USAGE)
    assert usage.data()["model"] == "scripted-a"
    assert events[-1].data()["usage"]["model"] == "scripted-a"
    # a provider's own per-call figure says nothing of a model until the run names it
    assert Usage(1, 2).to_dict() == {"input_tokens": 1, "output_tokens": 2}
    total = Usage()
    total.add(Usage(1, 1, "a"))
    total.add(Usage(2, 2))
    assert total.to_dict() == {"input_tokens": 3, "output_tokens": 3, "model": "a"}
