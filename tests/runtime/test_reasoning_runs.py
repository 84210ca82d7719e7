"""Reasoning across a run: failover, checkpoints and resume, cut calls, usage events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    AgentRunConfig,
    ModelBinding,
    ModelBindings,
    RunCancelledError,
    RunCheckpoint,
    tool,
)
from agent_runtime.messages import (
    AssistantMessage,
    ReasoningState,
    UserMessage,
    message_to_dict,
)
from agent_runtime.model import ModelResponse, Usage
from agent_runtime.testing import ScriptedModel
from tests.fakes.upstream import (
    FakeToolCall,
    FakeUpstream,
    Gate,
    Reasoning,
    Text,
    ToolCalls,
    freeze_imports,
    status,
)
from tests.support.checkpoints import Sink

freeze_imports()

KEY = "sk-test-reasoning-0123456789abcdef"
THINKING = {"type": "enabled", "budget_tokens": 1024}
SIGNED = [Reasoning("Plan: look it up.", signature="SIG-XYZ"), Reasoning(redacted="REDACTED-1")]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


def claude(upstream: FakeUpstream) -> ModelBinding:
    return ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        client_max_retries=0,
        params={"thinking": THINKING, "prompt_caching": False},
    )


def gpt(upstream: FakeUpstream) -> ModelBinding:
    return ModelBinding.llm(
        model="gpt-test", api_key=KEY, base_url=upstream.openai_url, client_max_retries=0
    )


def effects() -> tuple[list[str], object]:
    sent: list[str] = []

    @tool
    def send_mail(to: str) -> str:
        """Send a mail (not idempotent)."""
        sent.append(to)
        return f"sent to {to}"

    return sent, send_mail


async def test_failover_never_sends_another_providers_signed_state(upstream: FakeUpstream) -> None:
    sent, send_mail = effects()
    upstream.script(
        ToolCalls([FakeToolCall("send_mail", {"to": "ada"}, id="toolu_1")], reasoning=SIGNED),
        status(529, error_type="overloaded_error"),  # the second call: Claude is overloaded
        Text("Mail sent."),  # the fallback answers
    )
    bindings = ModelBindings(llm=[claude(upstream), gpt(upstream)])
    async with AgentCore.open(bindings, tools=[send_mail]) as agent:
        events = [event async for event in agent.stream("mail ada")]

    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert sent == ["ada"]
    assert [r.protocol for r in upstream.requests] == ["anthropic", "anthropic", "openai"]
    # Claude's own retry got its signed blocks back ...
    assert "SIG-XYZ" in upstream.requests[1].body.decode()
    # ... the fallback none of them, nor the thinking text as if it were its own
    fallback = upstream.requests[2]
    raw = fallback.body.decode()
    assert "SIG-XYZ" not in raw and "REDACTED-1" not in raw and "signature" not in raw
    assert "Plan: look it up." not in raw
    assert fallback.messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "send_mail", "arguments": '{"to": "ada"}'},
            }
        ],
    }
    # the visible reasoning stays the record of the turn
    [turn] = [
        m for m in events[-1].messages or [] if isinstance(m, AssistantMessage) and m.tool_calls
    ]
    assert turn.reasoning == "Plan: look it up."


async def test_a_resumed_run_sends_the_same_signed_blocks(upstream: FakeUpstream) -> None:
    sent, send_mail = effects()
    upstream.script(
        ToolCalls([FakeToolCall("send_mail", {"to": "ada"}, id="toolu_1")], reasoning=SIGNED)
    )
    # the save before the mail is sent fails: the run stops between the thinking and the result
    sink = Sink(fail_at=2)
    config = AgentRunConfig(session_id="s1", run_id="run_1")
    failed: list[AgentEvent] = []
    async with AgentCore.open(claude(upstream), tools=[send_mail]) as agent:
        with pytest.raises(RuntimeError, match="the store is gone"):
            async for event in agent.stream("mail ada", config=config, checkpoint_sink=sink):
                failed.append(event)
    assert failed[-1].type is AgentEventType.RUN_FAILED
    assert sent == []
    [checkpoint] = sink.saved
    assert [(c.name, c.state) for c in checkpoint.calls] == [("send_mail", "pending")]
    # the checkpoint keeps the signed state; what a client reads of the turn does not
    stored = json.loads(json.dumps(checkpoint.to_dict()))
    assert "SIG-XYZ" in json.dumps(stored)
    assert "SIG-XYZ" not in json.dumps([message_to_dict(m) for m in checkpoint.added])

    upstream.script(Text("Mail sent."))
    async with AgentCore.open(claude(upstream), tools=[send_mail]) as agent:
        resumed = [e async for e in agent.resume(RunCheckpoint.from_dict(stored))]
    assert resumed[-1].type is AgentEventType.RUN_COMPLETED
    assert sent == ["ada"]
    first, again = upstream.requests
    assert first.json["messages"][0] == again.json["messages"][0]
    assert again.json["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Plan: look it up.", "signature": "SIG-XYZ"},
        {"type": "redacted_thinking", "data": "REDACTED-1"},
        {"type": "tool_use", "id": "toolu_1", "name": "send_mail", "input": {"to": "ada"}},
    ]


async def test_a_call_cut_short_keeps_its_reasoning_so_far(upstream: FakeUpstream) -> None:
    gate = Gate()
    upstream.script(Text("Never finished", reasoning=[Reasoning("Thinking hard")], hold=gate))
    seen: list[AgentEvent] = []
    texting = asyncio.Event()

    async def consume(agent: AgentCore) -> None:
        config = AgentRunConfig(session_id="s1", run_id="r-cut")
        with contextlib.suppress(RunCancelledError):
            async for event in agent.stream("hi", config=config):
                seen.append(event)
                if event.type is AgentEventType.TEXT_DELTA:
                    texting.set()

    async with AgentCore.open(claude(upstream)) as agent:
        task = asyncio.create_task(consume(agent))
        await texting.wait()  # the upstream holds the stream after its first word
        assert agent.cancel_run("r-cut", "cancel_requested")
        await task
        gate.open()
    end = seen[-1]
    assert end.type is AgentEventType.RUN_CANCELLED
    assert end.messages == [
        UserMessage("hi"),
        AssistantMessage("Never ", reasoning="Thinking hard"),  # nothing signed yet: no state
    ]


async def test_usage_events_and_the_total_keep_the_details() -> None:
    detailed = Usage(100, 10, cached_input_tokens=90, cache_write_tokens=5, reasoning_tokens=3)
    model = ScriptedModel(
        [
            ModelResponse(AssistantMessage("a", reasoning="think"), detailed, "stop"),
        ],
        model_name="m",
    )
    agent = AgentCore(model)
    events = [e async for e in agent.stream("hi")]
    reasoning = [e.delta for e in events if e.type is AgentEventType.REASONING_DELTA]
    assert reasoning == ["think"]
    [usage] = [e.usage for e in events if e.type is AgentEventType.USAGE]
    assert usage is not None
    assert usage.to_dict() == {
        "input_tokens": 100,
        "output_tokens": 10,
        "cached_input_tokens": 90,
        "cache_write_tokens": 5,
        "reasoning_tokens": 3,
        "model": "m",
    }
    assert events[-1].usage is not None
    assert events[-1].usage.to_dict() == usage.to_dict()


def test_a_checkpoint_round_trips_the_usage_details_and_the_state() -> None:
    state = ReasoningState("anthropic", ({"type": "redacted_thinking", "data": "D"},))
    checkpoint = RunCheckpoint(
        run_id="r",
        session_id="s",
        step=1,
        prompt="p",
        added=(AssistantMessage("a", reasoning="t", reasoning_state=state),),
        iteration=1,
        usage=Usage(10, 2, "m", cached_input_tokens=8, reasoning_tokens=1),
    )
    back = RunCheckpoint.from_dict(json.loads(json.dumps(checkpoint.to_dict())))
    assert back.usage == checkpoint.usage
    assert back.added == checkpoint.added
