"""AnthropicModel against the fake upstream, through the real SDK over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agent_runtime import AgentCore, AgentEventType, ModelBinding, tool
from agent_runtime.errors import (
    ProviderConnectionError,
    ProviderError,
    ProviderStatusError,
    ProviderTimeoutError,
)
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runtime.model import ModelEvent, ModelEventKind, ModelRequest, ToolSpec
from agent_runtime.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicModel
from tests.fakes.upstream import (
    Drop,
    Endless,
    FakeToolCall,
    FakeUpstream,
    Malformed,
    Stall,
    StreamError,
    Text,
    ToolCalls,
    freeze_imports,
    status,
)

freeze_imports()  # keep full collections short: see its docstring

KEY = "sk-ant-test-0123456789abcdef"
EPHEMERAL = {"type": "ephemeral"}

WEATHER = ToolSpec(
    "weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


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


def ask(text: str = "Hi", **fields: object) -> ModelRequest:
    return ModelRequest(messages=[UserMessage(text)], **fields)  # type: ignore[arg-type]


async def collect(model: AnthropicModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


async def test_text_streams_with_usage_from_start_and_delta(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Text("Hello from Claude", usage=(13, 5)))

    events = await collect(model, ask("Hi", system="Be brief."))

    assert [e.delta for e in events if e.kind is ModelEventKind.TEXT] == [
        "Hello ",
        "from ",
        "Claude",
    ]
    response = events[-1].response
    assert events[-1].kind is ModelEventKind.COMPLETED and response is not None
    assert response.message.content == "Hello from Claude"
    assert response.usage is not None
    assert response.usage.to_dict() == {"input_tokens": 13, "output_tokens": 5}
    assert response.stop_reason == "end_turn"

    (sent,) = upstream.requests
    assert sent.path == "/v1/messages"
    assert sent.api_key == KEY
    body = sent.json
    assert body["model"] == "claude-test"
    assert body["stream"] is True
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS
    # prompt caching is on by default: the system prompt and the conversation's end are marked
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": EPHEMERAL}]}
    ]


async def test_tool_use_blocks_assemble_input_json_fragments(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(
        ToolCalls(
            [
                FakeToolCall("weather", {"city": "Zürich"}, id="toolu_a", fragments=4),
                FakeToolCall("weather", {"city": "Lima"}, id="toolu_b", fragments=2),
            ],
            text="Let me check.",
            usage=(30, 12),
        )
    )

    events = await collect(model, ask(tools=[WEATHER]))

    calls = [e.call for e in events if e.kind is ModelEventKind.TOOL_CALL]
    assert calls == [
        ToolCall("toolu_a", "weather", {"city": "Zürich"}),
        ToolCall("toolu_b", "weather", {"city": "Lima"}),
    ]
    response = events[-1].response
    assert response is not None
    assert response.message.content == "Let me check."
    assert response.message.tool_calls == calls
    assert response.stop_reason == "tool_use"
    assert response.usage is not None
    assert response.usage.to_dict() == {"input_tokens": 30, "output_tokens": 12}
    assert upstream.requests[0].json["tools"] == [
        {
            "name": "weather",
            "description": "The weather in a city.",
            "input_schema": WEATHER.parameters,
            "cache_control": EPHEMERAL,
        }
    ]


async def test_tool_round_trip_through_the_agent(upstream: FakeUpstream) -> None:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"rain in {city}"

    upstream.script(
        ToolCalls([FakeToolCall("weather", {"city": "Bergen"}, id="toolu_1")], usage=(9, 4)),
        Text("It rains in Bergen.", usage=(21, 5)),
    )
    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        client_max_retries=0,
    )
    async with AgentCore.open(binding, tools=[weather], system_prompt="You help.") as agent:
        events = [event async for event in agent.stream("Weather in Bergen?")]

    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert events[-1].usage is not None
    assert events[-1].usage.to_dict() == {
        "input_tokens": 30,
        "output_tokens": 9,
        "model": "claude-test",
    }
    text = "".join(e.delta or "" for e in events if e.type is AgentEventType.TEXT_DELTA)
    assert text == "It rains in Bergen."

    first, second = upstream.requests
    assert first.json["system"] == [
        {"type": "text", "text": "You help.", "cache_control": EPHEMERAL}
    ]
    assert second.json["messages"] == [
        {
            "role": "user",
            # the previous call's end: its cache entry is read back
            "content": [{"type": "text", "text": "Weather in Bergen?", "cache_control": EPHEMERAL}],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Bergen"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "rain in Bergen",
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]


async def test_history_alternates_and_merges_tool_results(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Text("ok"))
    history: list[Message] = [
        SystemMessage("Extra rule."),
        UserMessage("first"),
        AssistantMessage(
            "Two lookups.",
            [ToolCall("t1", "weather", {"city": "A"}), ToolCall("t2", "weather", {"city": "B"})],
        ),
        ToolMessage("t1", "weather", "sunny"),
        ToolMessage("t2", "weather", "Error: unknown city", is_error=True),
        UserMessage("and now?"),
    ]
    # without prompt caching the system prompt is one string
    request = ModelRequest(messages=history, system="Top rule.", params={"prompt_caching": False})
    await collect(model, request)

    body = upstream.requests[0].json
    assert body["system"] == "Top rule.\n\nExtra rule."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Two lookups."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "A"}},
                {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "B"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "Error: unknown city",
                    "is_error": True,
                },
                {"type": "text", "text": "and now?"},
            ],
        },
    ]


async def test_max_tokens_default_and_override(upstream: FakeUpstream) -> None:
    upstream.script(Text("a"), Text("b"))
    model = AnthropicModel(
        "claude-test",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        max_retries=0,
        max_tokens=256,
        params={"temperature": 0.1},
    )
    try:
        await collect(model, ask())
        await collect(model, ask(params={"max_tokens": 32}))
    finally:
        await model.aclose()
    first, second = (request.json for request in upstream.requests)
    assert (first["max_tokens"], first["temperature"]) == (256, 0.1)
    assert (second["max_tokens"], second["temperature"]) == (32, 0.1)


@pytest.mark.parametrize(
    ("fault", "kind", "retryable", "code", "retry_after"),
    [
        (status(429, retry_after=2), ProviderStatusError, True, 429, 2.0),
        (status(500), ProviderStatusError, True, 500, None),
        (status(529), ProviderStatusError, True, 529, None),
        (status(400), ProviderStatusError, False, 400, None),
        (status(401), ProviderStatusError, False, 401, None),
        (status(413), ProviderStatusError, False, 413, None),
        (Drop(), ProviderConnectionError, True, None, None),
        (Drop(send_headers=True), ProviderConnectionError, True, None, None),
        (StreamError("overloaded_error"), ProviderStatusError, True, None, None),
        (StreamError("api_error"), ProviderStatusError, True, None, None),
        (StreamError("invalid_request_error"), ProviderStatusError, False, None, None),
        (Malformed(), ProviderError, False, None, None),
        (Malformed(sse=True), ProviderError, False, None, None),
        (Malformed(b"<html>bad gateway</html>", "text/html"), ProviderError, False, None, None),
    ],
    ids=lambda value: repr(value)[:40] if not isinstance(value, (type, bool)) else None,
)
async def test_failures_map_to_provider_errors(
    upstream: FakeUpstream,
    model: AnthropicModel,
    fault: object,
    kind: type[ProviderError],
    retryable: bool,
    code: int | None,
    retry_after: float | None,
) -> None:
    upstream.script(fault)  # type: ignore[arg-type]

    with pytest.raises(ProviderError) as caught:
        await collect(model, ask())

    error = caught.value
    assert type(error) is kind
    assert (error.retryable, error.status_code, error.retry_after) == (
        retryable,
        code,
        retry_after,
    )
    assert error.provider == "anthropic"
    assert error.reason == ("malformed_response" if isinstance(fault, Malformed) else None)


async def test_a_raw_transport_error_mid_stream_is_a_connection_error(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    # the Anthropic SDK lets httpx2's RemoteProtocolError escape from the stream as is
    upstream.script(Drop(after_chunks=1, text="Partial text"))
    seen: list[str] = []
    with pytest.raises(ProviderConnectionError) as caught:
        async for event in model.stream(ask()):
            seen.append(event.delta)
    assert seen == ["Partial "]
    assert caught.value.retryable
    assert type(caught.value.__cause__).__module__.startswith("httpx")


async def test_a_stall_past_the_client_timeout_is_a_timeout(upstream: FakeUpstream) -> None:
    upstream.script(Stall())
    model = AnthropicModel(
        "claude-test", api_key=KEY, base_url=upstream.anthropic_url, max_retries=0, timeout=0.3
    )
    try:
        with pytest.raises(ProviderTimeoutError):
            await collect(model, ask())
    finally:
        await model.aclose()


async def test_closing_the_stream_early_closes_the_connection(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    upstream.script(Endless(text="never ending story", after_chunks=2))
    stream = model.stream(ask())
    first = await anext(stream)
    assert first.delta == "never "
    await stream.aclose()  # type: ignore[attr-defined]
    await upstream.wait_until(lambda: upstream.disconnects == 1)


async def test_repr_and_close(upstream: FakeUpstream) -> None:
    model = AnthropicModel("claude-test", api_key=KEY, base_url=upstream.anthropic_url)
    assert KEY not in repr(model) and "claude-test" in repr(model)
    await model.aclose()
    await model.aclose()
    assert model.client.is_closed()
    with pytest.raises(ProviderError, match="closed"):
        await collect(model, ask())


async def test_a_body_that_ends_before_the_answer_does_is_a_dropped_connection(
    upstream: FakeUpstream, model: AnthropicModel
) -> None:
    # the HTTP body ends properly, but the answer never did (no stop_reason): the SDK would take
    # the text so far for the whole answer
    upstream.script(Drop(after_chunks=1, text="Partial text", clean=True))
    seen: list[str] = []
    with pytest.raises(ProviderConnectionError, match="no stop_reason") as caught:
        async for event in model.stream(ask()):
            seen.append(event.delta)
    assert seen == ["Partial "]
    assert caught.value.retryable
    assert upstream.requests[-1].outcome.startswith("dropped")
