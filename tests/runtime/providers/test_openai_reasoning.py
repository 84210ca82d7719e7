"""OpenAIModel's usage details and reasoning_content, through the real SDK over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent_runtime import AgentCore, AgentEventType, ModelBinding, tool
from agent_runtime.messages import UserMessage
from agent_runtime.model import ModelEventKind, ModelRequest
from agent_runtime.providers.openai import OpenAIModel
from tests.fakes.upstream import (
    FakeToolCall,
    FakeUpstream,
    Reasoning,
    Text,
    ToolCalls,
    UsageDetails,
    freeze_imports,
)

freeze_imports()

KEY = "sk-test-openai-0123456789abcdef"


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"rain in {city}"


async def test_usage_details_are_read_where_reported(upstream: FakeUpstream) -> None:
    # prompt_tokens count the cached ones; reasoning_tokens are a part of completion_tokens
    upstream.script(
        Text("a", usage=(100, 20), details=UsageDetails(cached=60, reasoning=7)),
        Text("b", usage=(5, 1)),
    )
    model = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    try:
        detailed = [e async for e in model.stream(ModelRequest([UserMessage("hi")]))]
        plain = [e async for e in model.stream(ModelRequest([UserMessage("hi")]))]
    finally:
        await model.aclose()
    assert detailed[-1].response is not None and detailed[-1].response.usage is not None
    assert detailed[-1].response.usage.to_dict() == {
        "input_tokens": 100,
        "output_tokens": 20,
        "cached_input_tokens": 60,
        "reasoning_tokens": 7,
    }
    assert plain[-1].response is not None and plain[-1].response.usage is not None
    assert plain[-1].response.usage.to_dict() == {"input_tokens": 5, "output_tokens": 1}


async def test_reasoning_content_streams_as_reasoning_and_is_not_sent_back(
    upstream: FakeUpstream,
) -> None:
    upstream.script(
        ToolCalls(
            [FakeToolCall("weather", {"city": "Oslo"}, id="call_1")],
            reasoning=[Reasoning("Weather needs a tool.")],
        ),
        Text("Rain.", details=UsageDetails(cached=3, reasoning=4)),
    )
    binding = ModelBinding.llm(
        model="deepseek-reasoner", api_key=KEY, base_url=upstream.openai_url, client_max_retries=0
    )
    async with AgentCore.open(binding, tools=[weather]) as agent:
        events = [event async for event in agent.stream("Oslo?")]

    reasoning = [e for e in events if e.type is AgentEventType.REASONING_DELTA]
    assert "".join(e.delta or "" for e in reasoning) == "Weather needs a tool."
    first_text = next(i for i, e in enumerate(events) if e.type is AgentEventType.TOOL_CALL_STARTED)
    assert events.index(reasoning[-1]) < first_text
    completed = events[-1]
    assert completed.type is AgentEventType.RUN_COMPLETED
    assert completed.usage is not None
    assert (completed.usage.cached_input_tokens, completed.usage.reasoning_tokens) == (3, 4)
    [usage_with_details] = [
        e.usage
        for e in events
        if e.type is AgentEventType.USAGE and e.usage and e.usage.cached_input_tokens
    ]
    assert usage_with_details.model == "deepseek-reasoner"
    second = upstream.requests[1].json
    assert second["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    assert "reasoning" not in upstream.requests[1].body.decode()


async def test_reasoning_events_of_a_model_call_lead_its_text(upstream: FakeUpstream) -> None:
    upstream.script(Text("Four.", reasoning=[Reasoning("two plus two")]))
    model = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    try:
        events = [e async for e in model.stream(ModelRequest([UserMessage("2+2?")]))]
    finally:
        await model.aclose()
    kinds = [e.kind for e in events]
    assert kinds == [
        ModelEventKind.REASONING,
        ModelEventKind.REASONING,
        ModelEventKind.REASONING,
        ModelEventKind.TEXT,
        ModelEventKind.COMPLETED,
    ]
    assert events[-1].response is not None
    assert events[-1].response.message.reasoning == "two plus two"
