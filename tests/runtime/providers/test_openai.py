"""OpenAIModel against the fake upstream, through the real SDK over loopback."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator

import pytest

from agent_runtime import AgentCore, AgentEventType, ModelBinding, presets, tool
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
from agent_runtime.providers.openai import OpenAIModel
from tests.fakes.upstream import (
    Drop,
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

KEY = "sk-test-openai-0123456789abcdef"


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


@pytest.fixture
async def model(upstream: FakeUpstream) -> AsyncIterator[OpenAIModel]:
    built = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    yield built
    await built.aclose()


def ask(text: str = "Hi", **fields: object) -> ModelRequest:
    return ModelRequest(messages=[UserMessage(text)], **fields)  # type: ignore[arg-type]


async def collect(model: OpenAIModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


WEATHER = ToolSpec(
    "weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


async def test_text_streams_as_deltas_then_completed_with_usage(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(Text("Hello brave new world", usage=(7, 4)))

    events = await collect(model, ask("Hi", system="Be brief."))

    assert [e.delta for e in events if e.kind is ModelEventKind.TEXT] == [
        "Hello ",
        "brave ",
        "new ",
        "world",
    ]
    last = events[-1]
    assert last.kind is ModelEventKind.COMPLETED and last.response is not None
    assert last.response.message.content == "Hello brave new world"
    assert last.response.message.tool_calls == []
    assert last.response.usage is not None
    assert last.response.usage.to_dict() == {"input_tokens": 7, "output_tokens": 4}
    assert last.response.stop_reason == "stop"

    (sent,) = upstream.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    body = sent.json
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert "tools" not in body


async def test_params_and_request_options_reach_the_wire(upstream: FakeUpstream) -> None:
    # the body is built here, not by create(): what the SDK's options did must still happen
    model = OpenAIModel(
        "gpt-test",
        api_key=KEY,
        base_url=upstream.openai_url,
        max_retries=0,
        params={"temperature": 0.5, "seed": 1},
    )
    upstream.script(Text("ok"))
    request = ask(
        params={
            "seed": 2,
            "stream_options": None,
            "extra_body": {"seed": 3, "top_k": 5},
            "extra_headers": {"X-Trace": "t-1"},
            "timeout": 30.0,
        }
    )
    try:
        await collect(model, request)
    finally:
        await model.aclose()
    (sent,) = upstream.requests
    body = sent.json
    # the request's params win over the model's and over extra_body, as they did before
    assert (body["temperature"], body["seed"], body["top_k"]) == (0.5, 2, 5)
    assert "stream_options" not in body and "extra_body" not in body and "timeout" not in body
    assert sent.headers["x-trace"] == "t-1"
    assert sent.headers["authorization"] == f"Bearer {KEY}"


async def test_fragmented_tool_calls_are_assembled_by_index(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(
        ToolCalls(
            [
                FakeToolCall("weather", {"city": "Zürich", "unit": "C"}, id="call_a", fragments=5),
                FakeToolCall("weather", {"city": "Paris"}, id="call_b", fragments=3),
            ],
            text="Checking.",
            usage=(20, 9),
        )
    )

    events = await collect(model, ask("weather?", tools=[WEATHER]))

    kinds = [e.kind for e in events]
    assert kinds[0] is ModelEventKind.TEXT
    assert kinds[-3:] == [
        ModelEventKind.TOOL_CALL,
        ModelEventKind.TOOL_CALL,
        ModelEventKind.COMPLETED,
    ]
    calls = [e.call for e in events if e.kind is ModelEventKind.TOOL_CALL]
    assert calls == [
        ToolCall("call_a", "weather", {"city": "Zürich", "unit": "C"}),
        ToolCall("call_b", "weather", {"city": "Paris"}),
    ]
    response = events[-1].response
    assert response is not None
    assert response.message.content == "Checking."
    assert response.message.tool_calls == calls
    assert response.stop_reason == "tool_calls"
    assert response.usage is not None and response.usage.to_dict() == {
        "input_tokens": 20,
        "output_tokens": 9,
    }
    assert upstream.requests[0].json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]


async def test_tool_round_trip_through_the_agent(upstream: FakeUpstream) -> None:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    upstream.script(
        ToolCalls([FakeToolCall("weather", {"city": "Oslo"}, id="call_1")], usage=(10, 3)),
        Text("It is sunny in Oslo.", usage=(25, 6)),
    )
    binding = ModelBinding.llm(
        model="gpt-test", api_key=KEY, base_url=upstream.openai_url, client_max_retries=0
    )
    async with AgentCore.open(binding, tools=[weather], system_prompt="You help.") as agent:
        events = [event async for event in agent.stream("Weather in Oslo?")]

    types = [e.type for e in events]
    assert types[0] is AgentEventType.RUN_STARTED and events[0].model == "gpt-test"
    assert types[-1] is AgentEventType.RUN_COMPLETED
    started = next(e for e in events if e.type is AgentEventType.TOOL_CALL_STARTED)
    assert (started.tool_call_id, started.name, started.arguments) == (
        "call_1",
        "weather",
        {"city": "Oslo"},
    )
    completed = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert completed.result == "sunny in Oslo" and not completed.is_error
    text = "".join(e.delta or "" for e in events if e.type is AgentEventType.TEXT_DELTA)
    assert text == "It is sunny in Oslo."
    usages = [e for e in events if e.type is AgentEventType.USAGE]
    assert [u.usage.to_dict() for u in usages if u.usage] == [
        {"input_tokens": 10, "output_tokens": 3, "model": "gpt-test"},
        {"input_tokens": 25, "output_tokens": 6, "model": "gpt-test"},
    ]
    assert usages[0].model_call_id != usages[1].model_call_id
    final = events[-1]
    assert final.usage is not None
    assert final.usage.to_dict() == {"input_tokens": 35, "output_tokens": 9, "model": "gpt-test"}

    first, second = upstream.requests
    assert first.json["messages"][0] == {"role": "system", "content": "You help."}
    assert second.json["messages"][1:] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny in Oslo"},
    ]
    assert binding.built is False  # the agent's close closed what the binding built


async def test_history_maps_every_message_kind(upstream: FakeUpstream, model: OpenAIModel) -> None:
    upstream.script(Text("ok"))
    history: list[Message] = [
        SystemMessage("Extra rule."),
        UserMessage("first"),
        AssistantMessage("plain answer"),
        UserMessage("again"),
        AssistantMessage(None, [ToolCall("c1", "weather", {"city": "Rome"})]),
        ToolMessage("c1", "weather", "Error: no data", is_error=True),
    ]
    await collect(model, ModelRequest(messages=history, system="Top rule."))

    assert upstream.requests[0].json["messages"] == [
        {"role": "system", "content": "Top rule."},
        {"role": "system", "content": "Extra rule."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "plain answer"},
        {"role": "user", "content": "again"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Error: no data"},
    ]


async def test_params_go_into_the_body_and_request_params_win(upstream: FakeUpstream) -> None:
    upstream.script(Text("ok"))
    model = OpenAIModel(
        "gpt-test",
        api_key=KEY,
        base_url=upstream.openai_url,
        max_retries=0,
        params={"temperature": 0.2, "max_tokens": 50, "timeout": 30},
    )
    try:
        await collect(model, ask(params={"max_tokens": 5, "seed": 7}))
    finally:
        await model.aclose()
    body = upstream.requests[0].json
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 5, 7)
    assert "timeout" not in body  # an SDK option, not a body field


@pytest.mark.parametrize(
    ("fault", "kind", "retryable", "code", "retry_after"),
    [
        (status(429, retry_after=3), ProviderStatusError, True, 429, 3.0),
        (status(429, retry_after_ms=1500), ProviderStatusError, True, 429, 1.5),
        (status(408), ProviderStatusError, True, 408, None),
        (status(409), ProviderStatusError, True, 409, None),
        (status(500), ProviderStatusError, True, 500, None),
        (status(503, retry_after=1), ProviderStatusError, True, 503, 1.0),
        (status(529), ProviderStatusError, True, 529, None),
        (status(400, "bad field"), ProviderStatusError, False, 400, None),
        (status(401), ProviderStatusError, False, 401, None),
        (status(403), ProviderStatusError, False, 403, None),
        (status(404), ProviderStatusError, False, 404, None),
        (status(422), ProviderStatusError, False, 422, None),
        (status(500, headers={"x-should-retry": "false"}), ProviderStatusError, False, 500, None),
        (Drop(), ProviderConnectionError, True, None, None),
        (Drop(send_headers=True), ProviderConnectionError, True, None, None),
        (Drop(reset=True), ProviderConnectionError, True, None, None),
        (StreamError("server_error"), ProviderStatusError, True, None, None),
        (StreamError("invalid_request_error"), ProviderStatusError, False, None, None),
        (Malformed(), ProviderError, False, None, None),
        (Malformed(sse=True), ProviderError, False, None, None),
        (Malformed(b"<html>bad gateway</html>", "text/html"), ProviderError, False, None, None),
    ],
    ids=lambda value: repr(value)[:40] if not isinstance(value, (type, bool)) else None,
)
async def test_failures_map_to_provider_errors(
    upstream: FakeUpstream,
    model: OpenAIModel,
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
    assert error.retryable is retryable
    assert error.status_code == code
    assert error.retry_after == retry_after
    assert error.provider == "openai"
    assert "gpt-test" in str(error)
    assert error.reason == ("malformed_response" if isinstance(fault, Malformed) else None)
    if not isinstance(fault, Malformed) or fault.sse:
        assert error.__cause__ is not None  # the SDK's exception stays attached, scrubbed


@pytest.mark.parametrize(
    "data",
    [
        b"[1, 2]",
        b'{"choices": "none"}',
        b'{"choices": [{"index": 0, "delta": "hello"}]}',
        b'{"choices": [{"index": 0, "delta": {"content": 7}}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": {"index": 0}}}]}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
    ],
    ids=["array", "choices", "delta", "content", "tool_calls", "index"],
)
async def test_a_chunk_of_the_wrong_shape_is_a_malformed_answer(
    upstream: FakeUpstream, model: OpenAIModel, data: bytes
) -> None:
    # the chunks are read as plain JSON: a shape the protocol does not have is named, not a crash
    upstream.script(Malformed(data, sse=True))
    with pytest.raises(ProviderError) as caught:
        await collect(model, ask())
    assert type(caught.value) is ProviderError
    assert caught.value.reason == "malformed_response"
    assert "gpt-test" in str(caught.value) and "in its stream" in str(caught.value)


async def test_a_400_keeps_the_upstream_text_beside_its_message(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    # the message (what a service's clients read) names the status and the error type; the
    # upstream's own text, which may quote a key or the request, is for the developer only
    upstream.script(status(400, "Invalid value for 'messages[0].role'"))
    with pytest.raises(ProviderStatusError) as caught:
        await collect(model, ask())
    assert str(caught.value) == "openai model 'gpt-test' answered HTTP 400 (invalid_request_error)"
    assert caught.value.upstream_detail == "Invalid value for 'messages[0].role'"


async def test_a_masked_key_in_the_upstream_text_is_redacted(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(
        status(401, "Incorrect API key provided: sk-canar*****7f3a9.", error_type="invalid_api_key")
    )
    with pytest.raises(ProviderStatusError) as caught:
        await collect(model, ask())
    assert "canar" not in str(caught.value) and "7f3a9" not in str(caught.value)
    assert caught.value.upstream_detail == "Incorrect API key provided: sk-[REDACTED]."


async def test_drop_after_the_first_chunk_fails_after_that_chunk(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(Drop(after_chunks=1, text="Hello there"))
    seen: list[str] = []
    with pytest.raises(ProviderConnectionError) as caught:
        async for event in model.stream(ask()):
            seen.append(event.delta)
    assert seen == ["Hello "]
    assert caught.value.retryable


async def test_a_stall_past_the_client_timeout_is_a_timeout(upstream: FakeUpstream) -> None:
    upstream.script(Stall())
    model = OpenAIModel(
        "gpt-test", api_key=KEY, base_url=upstream.openai_url, max_retries=0, timeout=0.3
    )
    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            await collect(model, ask())
    finally:
        await model.aclose()
    assert caught.value.retryable
    await upstream.wait_until(lambda: upstream.disconnects == 1)


async def test_a_refused_connection_is_a_connection_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIModel(
        "gpt-test", api_key=KEY, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
    )
    try:
        with pytest.raises(ProviderConnectionError) as caught:
            await collect(model, ask())
    finally:
        await model.aclose()
    assert caught.value.retryable


async def test_arguments_that_are_not_json_fail_the_call(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(ToolCalls([FakeToolCall("weather", '{"city": "Par')]))
    with pytest.raises(ProviderError, match="not valid JSON") as caught:
        await collect(model, ask(tools=[WEATHER]))
    assert not caught.value.retryable
    assert caught.value.__cause__ is None


async def test_missing_arguments_are_an_empty_object(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    upstream.script(ToolCalls([FakeToolCall("now", "")]))
    events = await collect(model, ask())
    (call,) = [e.call for e in events if e.kind is ModelEventKind.TOOL_CALL]
    assert call is not None and call.arguments == {}


async def test_close_is_idempotent_and_a_closed_model_refuses_calls(upstream: FakeUpstream) -> None:
    model = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url)
    states = [model.closed]
    await model.aclose()
    await model.aclose()
    states.append(model.closed)
    assert model.model_name == "gpt-test"
    assert states == [False, True] and model.client.is_closed()
    with pytest.raises(ProviderError, match="closed"):
        await collect(model, ask())


async def test_a_supplied_client_is_not_closed(upstream: FakeUpstream) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=KEY, base_url=upstream.openai_url, max_retries=0)
    model = OpenAIModel("gpt-test", client=client)
    await model.aclose()
    assert not client.is_closed()
    await client.close()


async def test_client_options_reach_the_sdk_client(upstream: FakeUpstream) -> None:
    model = OpenAIModel("m", api_key=KEY, base_url=upstream.openai_url, timeout=4, max_retries=1)
    try:
        assert model.client.max_retries == 1
        assert model.client.timeout == 4
        assert model.retry.max_retries == 0  # the runtime fails over instead of repeating
    finally:
        await model.aclose()


async def test_repr_names_the_model_and_endpoint_never_the_key(upstream: FakeUpstream) -> None:
    model = OpenAIModel("gpt-test", api_key=KEY, base_url=upstream.openai_url)
    try:
        text = repr(model)
    finally:
        await model.aclose()
    assert "gpt-test" in text and upstream.openai_url in text and KEY not in text


async def test_any_compatible_endpoint_via_a_preset(upstream: FakeUpstream) -> None:
    upstream.script(Text("local answer"))
    binding = presets.vllm(model="served-model", base_url=upstream.openai_url, client_max_retries=0)
    async with AgentCore.open(binding) as agent:
        response = await agent.chat("hello")
    assert response.content == "local answer"
    (sent,) = upstream.requests
    assert sent.model == "served-model"
    assert sent.api_key == "EMPTY"  # vLLM's placeholder when it runs without --api-key


async def test_a_body_that_ends_before_the_answer_does_is_a_dropped_connection(
    upstream: FakeUpstream, model: OpenAIModel
) -> None:
    # the HTTP body ends properly, but the answer never did (no finish_reason): the SDK would take
    # the text so far for the whole answer
    upstream.script(Drop(after_chunks=1, text="Hello there", clean=True))
    seen: list[str] = []
    with pytest.raises(ProviderConnectionError, match="no finish_reason") as caught:
        async for event in model.stream(ask()):
            seen.append(event.delta)
    assert seen == ["Hello "]
    assert caught.value.retryable
    assert upstream.requests[-1].outcome.startswith("dropped")
