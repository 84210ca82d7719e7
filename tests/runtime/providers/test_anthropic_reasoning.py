"""AnthropicModel's extended thinking and cache counts, through the real SDK over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEventType, ModelBinding, tool
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    ReasoningState,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runtime.model import ModelEvent, ModelEventKind, ModelRequest, OutputSchema, ToolSpec
from agent_runtime.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicModel
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

KEY = "sk-ant-test-0123456789abcdef"
THINKING = {"type": "enabled", "budget_tokens": 2048}
NO_CACHE = {"prompt_caching": False}


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


@pytest.fixture
async def model(upstream: FakeUpstream) -> AsyncIterator[AnthropicModel]:
    built = AnthropicModel(
        "claude-test", api_key=KEY, base_url=upstream.anthropic_url, max_retries=0
    )
    yield built
    await built.aclose()


async def collect(model: AnthropicModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


def binding(upstream: FakeUpstream, **params: Any) -> ModelBinding:
    return ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        client_max_retries=0,
        params={"thinking": THINKING, **params},
    )


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"rain in {city}"


async def test_thinking_streams_as_reasoning_and_its_blocks_become_the_state(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(
        Text(
            "It is 4.",
            reasoning=[
                Reasoning("Two plus two.", signature="SIG-one"),
                Reasoning(redacted="ENCRYPTED-DATA"),
                Reasoning("Still four.", signature="SIG-two"),
            ],
        )
    )
    events = await collect(
        model, ModelRequest([UserMessage("2+2?")], params={"thinking": THINKING})
    )

    kinds = [e.kind for e in events]
    # every reasoning delta comes before the text it leads to
    assert kinds.index(ModelEventKind.TEXT) > max(
        i for i, k in enumerate(kinds) if k is ModelEventKind.REASONING
    )
    reasoning = "".join(e.delta for e in events if e.kind is ModelEventKind.REASONING)
    assert reasoning == "Two plus two.\n\nStill four."
    response = events[-1].response
    assert response is not None
    message = response.message
    assert message.content == "It is 4."
    assert message.reasoning == reasoning
    assert message.reasoning_state == ReasoningState(
        "anthropic",
        (
            {"type": "thinking", "thinking": "Two plus two.", "signature": "SIG-one"},
            {"type": "redacted_thinking", "data": "ENCRYPTED-DATA"},
            {"type": "thinking", "thinking": "Still four.", "signature": "SIG-two"},
        ),
    )
    assert upstream.requests[0].json["thinking"] == THINKING


async def test_the_tool_loop_sends_the_signed_thinking_before_the_tool_use(
    upstream: FakeUpstream,
) -> None:
    upstream.script(
        ToolCalls(
            [FakeToolCall("weather", {"city": "Bergen"}, id="toolu_1")],
            text="Checking.",
            reasoning=[
                Reasoning("I need the weather.", signature="SIG-a"),
                Reasoning(redacted="R"),
            ],
        ),
        Text("It rains.", reasoning=[Reasoning("Rain it is.")]),
    )
    async with AgentCore.open(binding(upstream, **NO_CACHE), tools=[weather]) as agent:
        events = [event async for event in agent.stream("Weather in Bergen?")]

    assert events[-1].type is AgentEventType.RUN_COMPLETED
    deltas = [e for e in events if e.type is AgentEventType.REASONING_DELTA]
    assert "".join(e.delta or "" for e in deltas) == "I need the weather.Rain it is."
    _, second = upstream.requests
    assert second.json["thinking"] == THINKING
    assert second.json["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Bergen?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I need the weather.", "signature": "SIG-a"},
                {"type": "redacted_thinking", "data": "R"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Bergen"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain in Bergen"}
            ],
        },
    ]
    # the run's messages keep the visible reasoning; the signed state is the provider's
    [answer] = [
        m for m in events[-1].messages or [] if isinstance(m, AssistantMessage) and m.tool_calls
    ]
    assert answer.reasoning == "I need the weather."
    assert answer.reasoning_state is not None and answer.reasoning_state.provider == "anthropic"


async def test_usage_counts_cache_reads_and_writes_as_input(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    # Anthropic's input_tokens (10) leave out the cache's 600 read and 300 written
    upstream.script(
        Text("ok", usage=(10, 40), details=UsageDetails(cached=600, cache_write=300, reasoning=25))
    )
    events = await collect(model, ModelRequest([UserMessage("hi")]))
    response = events[-1].response
    assert response is not None and response.usage is not None
    assert response.usage.to_dict() == {
        "input_tokens": 910,
        "output_tokens": 40,
        "cached_input_tokens": 600,
        "cache_write_tokens": 300,
        "reasoning_tokens": 25,
    }


async def test_a_tool_turn_of_another_provider_goes_on_without_thinking(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Text("It rains."))
    foreign = AssistantMessage(
        None,
        [ToolCall("call_1", "weather", {"city": "Oslo"})],
        reasoning="thought elsewhere",
        reasoning_state=ReasoningState("openai-responses", ({"type": "reasoning", "id": "rs_1"},)),
    )
    history: list[Message] = [
        UserMessage("Oslo?"),
        foreign,
        ToolMessage("call_1", "weather", "rain"),
    ]
    await collect(model, ModelRequest(history, params={"thinking": THINKING, **NO_CACHE}))

    body = upstream.requests[0].json
    assert "thinking" not in body  # the API refuses thinking on a turn that started without
    assistant = body["messages"][1]
    assert [block["type"] for block in assistant["content"]] == ["tool_use"]
    assert "rs_1" not in upstream.requests[0].body.decode()
    assert "thought elsewhere" not in upstream.requests[0].body.decode()


async def test_thinking_lets_the_model_choose_the_output_tool_and_raises_max_tokens(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(ToolCalls([FakeToolCall("Answer", {"n": 4})]))
    schema = OutputSchema("Answer", {"type": "object", "properties": {"n": {"type": "integer"}}})
    big = {"type": "enabled", "budget_tokens": 8000}
    request = ModelRequest([UserMessage("2+2?")], params={"thinking": big}, output_schema=schema)
    events = await collect(model, request)

    assert events[-1].response is not None
    assert events[-1].response.message.content == '{"n": 4}'
    body = upstream.requests[0].json
    # a forced tool is refused with manual thinking; max_tokens must exceed the budget
    assert body["tool_choice"] == {"type": "auto"}
    assert body["max_tokens"] == 8000 + DEFAULT_MAX_TOKENS


async def test_thinking_params_are_sent_as_given(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Text("ok"))
    adaptive = {"type": "adaptive"}
    await collect(
        model,
        ModelRequest(
            [UserMessage("hi")],
            tools=[ToolSpec("t", "A tool.", {"type": "object", "properties": {}})],
            params={"thinking": adaptive, "max_tokens": 1000},
        ),
    )
    body = upstream.requests[0].json
    assert body["thinking"] == adaptive
    assert body["max_tokens"] == 1000
    assert "prompt_caching" not in body
