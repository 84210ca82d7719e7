"""OpenAIResponsesModel against the fake upstream's /v1/responses, through the real SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEventType, ModelBinding, ModelBindings, tool
from agent_runtime.bindings import binding_from_spec
from agent_runtime.content import ImagePart, MemoryContentStore, TextPart
from agent_runtime.errors import ProviderConnectionError, ProviderError, ProviderStatusError
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    ReasoningState,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runtime.model import ModelEvent, ModelEventKind, ModelRequest, OutputSchema, ToolSpec
from agent_runtime.providers.openai_responses import OpenAIResponsesModel
from tests.fakes.upstream import (
    Drop,
    FakeToolCall,
    FakeUpstream,
    Malformed,
    Reasoning,
    StreamError,
    Text,
    ToolCalls,
    UsageDetails,
    freeze_imports,
    status,
)

freeze_imports()

KEY = "sk-test-responses-0123456789abcdef"
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
async def model(upstream: FakeUpstream) -> AsyncIterator[OpenAIResponsesModel]:
    built = OpenAIResponsesModel("gpt-r", api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    yield built
    await built.aclose()


async def collect(model: OpenAIResponsesModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


def binding(upstream: FakeUpstream, **params: Any) -> ModelBinding:
    return ModelBinding.llm(
        model="gpt-r",
        protocol="openai-responses",
        api_key=KEY,
        base_url=upstream.openai_url,
        client_max_retries=0,
        params=params or None,
    )


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"rain in {city}"


async def test_text_and_reasoning_stream_with_usage(
    upstream: FakeUpstream, model: OpenAIResponsesModel
) -> None:
    upstream.script(
        Text(
            "Hello there",
            reasoning=[Reasoning("Greet back.", id="rs_1", encrypted="ENC-1")],
            usage=(120, 30),
            details=UsageDetails(cached=100, reasoning=12),
        )
    )
    request = ModelRequest(
        [UserMessage("Hi")], system="Be brief.", params={"reasoning": {"effort": "low"}}
    )
    events = await collect(model, request)

    assert [(e.kind, e.delta) for e in events[:-1]] == [
        (ModelEventKind.REASONING, "Greet "),
        (ModelEventKind.REASONING, "back."),
        (ModelEventKind.TEXT, "Hello "),
        (ModelEventKind.TEXT, "there"),
    ]
    response = events[-1].response
    assert response is not None and response.usage is not None
    assert response.message.content == "Hello there"
    assert response.message.reasoning == "Greet back."
    assert response.message.reasoning_state == ReasoningState(
        "openai-responses",
        (
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Greet back."}],
                "encrypted_content": "ENC-1",
            },
        ),
    )
    assert response.usage.to_dict() == {
        "input_tokens": 120,
        "output_tokens": 30,
        "cached_input_tokens": 100,
        "cache_write_tokens": 0,
        "reasoning_tokens": 12,
    }
    assert response.stop_reason == "stop"

    (sent,) = upstream.requests
    assert sent.path == "/v1/responses"
    assert sent.api_key == KEY
    body = sent.json
    assert body["model"] == "gpt-r"
    assert (body["stream"], body["store"]) == (True, False)
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "Be brief."
    assert body["input"] == [{"role": "user", "content": "Hi"}]
    assert body["reasoning"] == {"summary": "auto", "effort": "low"}


async def test_the_tool_loop_sends_the_reasoning_item_before_the_function_call(
    upstream: FakeUpstream,
) -> None:
    upstream.script(
        ToolCalls(
            [FakeToolCall("weather", {"city": "Bergen"}, id="call_1")],
            reasoning=[Reasoning("Need the weather.", id="rs_a", encrypted="ENC-A")],
        ),
        Text("It rains in Bergen."),
    )
    async with AgentCore.open(binding(upstream), tools=[weather]) as agent:
        events = [event async for event in agent.stream("Weather in Bergen?")]

    assert events[-1].type is AgentEventType.RUN_COMPLETED
    reasoning = [e.delta for e in events if e.type is AgentEventType.REASONING_DELTA]
    assert "".join(r or "" for r in reasoning) == "Need the weather."
    first, second = upstream.requests
    assert first.json["tools"] == [
        {
            "type": "function",
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": weather.spec.parameters,
            "strict": False,
        }
    ]
    assert second.input == [
        {"role": "user", "content": "Weather in Bergen?"},
        {
            "type": "reasoning",
            "id": "rs_a",
            "summary": [{"type": "summary_text", "text": "Need the weather."}],
            "encrypted_content": "ENC-A",
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Bergen"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "rain in Bergen"},
    ]


async def test_history_maps_every_message_kind_and_drops_foreign_state(
    upstream: FakeUpstream, model: OpenAIResponsesModel
) -> None:
    upstream.script(Text("ok"))
    store = MemoryContentStore()
    stored = await store.put(b"\x89PNG\r\n\x1a\n" + b"0" * 16, media_type="image/png")
    signed = ReasoningState("anthropic", ({"type": "thinking", "thinking": "t", "signature": "S"},))
    history: list[Message] = [
        SystemMessage("Extra rule."),
        UserMessage([TextPart("Look:"), ImagePart(media_type="image/png", ref=stored.ref)]),
        AssistantMessage(
            "Two lookups.",
            [ToolCall("c1", "weather", {"city": "A"})],
            reasoning="thought by Claude",
            reasoning_state=signed,
        ),
        ToolMessage("c1", "weather", "Error: unknown city", is_error=True),
        UserMessage("and now?"),
    ]
    await collect(model, ModelRequest(history, content_store=store))

    items = upstream.requests[0].input
    assert items[0] == {"role": "system", "content": "Extra rule."}
    assert items[1]["content"][0] == {"type": "input_text", "text": "Look:"}
    image = items[1]["content"][1]
    assert image["type"] == "input_image" and image["image_url"].startswith(
        "data:image/png;base64,"
    )
    assert items[2:] == [
        {"role": "assistant", "content": "Two lookups."},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "A"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Error: unknown city"},
        {"role": "user", "content": "and now?"},
    ]
    raw = upstream.requests[0].body.decode()
    assert "signature" not in raw and "thought by Claude" not in raw


async def test_structured_output_is_a_json_schema_text_format(
    upstream: FakeUpstream, model: OpenAIResponsesModel
) -> None:
    upstream.script(Text('{"n": 4}'))
    schema = OutputSchema("Answer", {"type": "object", "properties": {"n": {"type": "integer"}}})
    request = ModelRequest(
        [UserMessage("2+2?")], output_schema=schema, params={"max_tokens": 50, "temperature": 0}
    )
    events = await collect(model, request)
    assert events[-1].response is not None
    assert events[-1].response.message.content == '{"n": 4}'
    body = upstream.requests[0].json
    assert body["text"] == {
        "format": {
            "type": "json_schema",
            "name": "Answer",
            "schema": schema.schema,
            "strict": False,
        }
    }
    assert (body["max_output_tokens"], body["temperature"]) == (50, 0)
    assert "max_tokens" not in body and "reasoning" not in body


@pytest.mark.parametrize(
    ("fault", "kind", "retryable"),
    [
        (status(429, retry_after=1), ProviderStatusError, True),
        (status(400), ProviderStatusError, False),
        (StreamError("server_error"), ProviderStatusError, True),
        (StreamError("invalid_prompt"), ProviderStatusError, False),
        (Drop(after_chunks=0, clean=True), ProviderConnectionError, True),
        (Malformed(b"{not json", sse=True), ProviderError, False),
    ],
    ids=["429", "400", "stream-server-error", "stream-invalid", "cut-short", "malformed"],
)
async def test_failures_map_to_provider_errors(
    upstream: FakeUpstream,
    model: OpenAIResponsesModel,
    fault: object,
    kind: type[ProviderError],
    retryable: bool,
) -> None:
    upstream.script(fault)  # type: ignore[arg-type]
    with pytest.raises(ProviderError) as caught:
        await collect(model, ModelRequest([UserMessage("hi")]))
    assert type(caught.value) is kind
    assert caught.value.retryable is retryable
    assert "gpt-r" in str(caught.value)
    assert "the upstream is overloaded" not in str(caught.value)  # upstream text stays out


async def test_a_failed_response_event_is_a_provider_error(
    upstream: FakeUpstream, model: OpenAIResponsesModel
) -> None:
    failed = (
        b'{"type": "response.failed", "sequence_number": 1, "response": {"id": "r",'
        b' "status": "failed", "error": {"code": "server_error", "message": "boom sk-abc"}}}'
    )
    upstream.script(Malformed(failed, sse=True))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(model, ModelRequest([UserMessage("hi")]))
    assert caught.value.retryable
    assert "server_error" in str(caught.value) and "boom" not in str(caught.value)


async def test_a_retryable_failure_fails_over_to_the_next_binding(upstream: FakeUpstream) -> None:
    upstream.script(status(503), Text("from the fallback"))
    fallback = ModelBinding.llm(
        model="gpt-chat", api_key=KEY, base_url=upstream.openai_url, client_max_retries=0
    )
    async with AgentCore.open(ModelBindings(llm=[binding(upstream), fallback])) as agent:
        answer = await agent.chat("hi")
    assert answer.message.content == "from the fallback"
    assert [r.protocol for r in upstream.requests] == ["responses", "openai"]


async def test_openai_responses_specs_build_this_wire(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.openai_url)
    spec = binding_from_spec("openai-responses:gpt-r", client_max_retries=0)
    assert (spec.protocol, spec.model) == ("openai-responses", "gpt-r")
    upstream.script(Text("ok"))
    async with AgentCore.open(spec) as agent:
        assert (await agent.chat("hi")).message.content == "ok"
        assert "OpenAIResponsesModel(model='gpt-r'" in repr(spec.provider)
    assert upstream.requests[0].path == "/v1/responses"
    assert upstream.requests[0].api_key == KEY
