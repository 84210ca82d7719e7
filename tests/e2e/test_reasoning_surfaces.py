"""A model's reasoning on every surface, read by each protocol's official client (unmodified)
from a real server process whose ``thinker`` agent reasons before each answer and tool call
(``tests/fakes/reasoning_models.py``): the native SSE stream, AG-UI (``@ag-ui/client``), the AI
SDK (``ai``'s ``readUIMessageStream``), OpenAI Responses and Chat Completions (``openai``,
streamed and not). The signed reasoning state never reaches any of them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseReasoningItem, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.fakes.reasoning_models import CACHE_WRITE_TOKENS, CACHED_TOKENS, SIGNATURE_PREFIX
from tests.support import npm as npm_clients
from tests.support.npm import JS
from tests.support.server import Server, launch
from tests.support.sse import read_events

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
AGENTS = """
[agents.thinker]
model = "python:tests.fakes.reasoning_models:thinker"
tools = ["current_time", "delete_file"]

[agents.thinker.policies]
delete_file = "ask"
"""
# what the thinker reasons on "what time is it?": one thought per model call
THOUGHTS = [
    'Thinking about "what time is it?", step 1.',
    'Thinking about "what time is it?", step 2.',
]
REASONING_TOKENS = 2 * 8  # the thoughts' words, one delta each


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("thinking-server")
    config = directory / "agents.toml"
    config.write_text(AGENTS, encoding="utf-8")
    server = launch(directory / "server", {"AGENT_CONFIG": str(config)})
    yield server
    server.stop()


@pytest.fixture
async def client(thinking_server: Server) -> AsyncIterator[AsyncOpenAI]:
    base_url = f"{thinking_server.base_url}/openai/v1"
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def scenario(script: str, server: Server, name: str) -> dict[str, Any]:
    """Run one scenario of ``tests/js/<script>_scenarios.mjs``; what it printed."""
    done = subprocess.run(
        [npm_clients.node(), str(JS / f"{script}_scenarios.mjs"), server.base_url, name],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{script} {name} failed:\n{done.stderr}\n{done.stdout}"
    assert SIGNATURE_PREFIX not in done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def test_native_stream_and_stored_conversation(thinking_server: Server) -> None:
    async with thinking_server.client() as http:
        events, _ = await read_events(
            http,
            "POST",
            "/v1/sessions/native-1/runs",
            json={"input": "what time is it?", "agent": "thinker"},
        )
        kinds = [e.type for e in events]
        said = "".join(e.data["data"]["delta"] for e in events if e.type == "reasoning.delta")
        assert said == "".join(THOUGHTS)
        assert kinds.index("reasoning.delta") < kinds.index("tool.call.started")
        usage = events[-1].data["data"]["usage"]
        assert (usage["cached_input_tokens"], usage["cache_write_tokens"]) == (
            2 * CACHED_TOKENS,
            2 * CACHE_WRITE_TOKENS,
        )
        assert usage["reasoning_tokens"] == REASONING_TOKENS
        listed = await http.get("/v1/sessions/native-1/messages")
        assistants = [m for m in listed.json()["messages"] if m["role"] == "assistant"]
        assert [m["reasoning"] for m in assistants] == THOUGHTS
        assert SIGNATURE_PREFIX not in listed.text
        assert all(SIGNATURE_PREFIX not in json.dumps(e.data) for e in events)


def test_agui_client_builds_reasoning_messages(thinking_server: Server) -> None:
    result = scenario("agui", thinking_server, "reasoning")
    assert result["reasoning"] == THOUGHTS
    assert result["roles"] == ["user", "reasoning", "assistant", "tool", "reasoning", "assistant"]
    assert result["text"].startswith("The time is ")
    (usage,) = result["usage"]
    assert usage["reasoningTokens"] == REASONING_TOKENS
    assert usage["cachedInputTokens"] == 2 * CACHED_TOKENS
    assert usage["cacheWriteInputTokens"] == 2 * CACHE_WRITE_TOKENS


def test_ai_sdk_client_builds_reasoning_parts(thinking_server: Server) -> None:
    result = scenario("ai_sdk", thinking_server, "reasoning")
    assert result["reasoning"] == THOUGHTS
    assert result["parts"] == [
        "step-start",
        "reasoning",
        "dynamic-tool",
        "step-start",
        "reasoning",
        "text",
    ]
    usage = result["usage"]
    assert usage["outputTokenDetails"]["reasoningTokens"] == REASONING_TOKENS
    assert usage["inputTokenDetails"]["cacheReadTokens"] == 2 * CACHED_TOKENS
    assert usage["inputTokenDetails"]["cacheWriteTokens"] == 2 * CACHE_WRITE_TOKENS


def _summaries(response: Response) -> list[str]:
    items = [item for item in response.output if isinstance(item, ResponseReasoningItem)]
    return ["".join(part.text for part in item.summary) for item in items]


async def test_responses_reasoning_items(client: AsyncOpenAI) -> None:
    response = await client.responses.create(model="thinker", input="what time is it?")
    assert response.status == "completed"
    assert [item.type for item in response.output] == [
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    assert _summaries(response) == THOUGHTS
    assert all(
        item.encrypted_content is None
        for item in response.output
        if isinstance(item, ResponseReasoningItem)
    )
    usage = response.usage
    assert usage is not None
    assert usage.output_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert usage.input_tokens_details.cached_tokens == 2 * CACHED_TOKENS
    assert SIGNATURE_PREFIX not in response.model_dump_json()
    # the output sent back as the next input, as a client managing its own context does: the
    # session holds it already, and the new message runs on
    sent_back: list[Any] = [item.model_dump(exclude_none=True) for item in response.output[:1]]
    follow_up = await client.responses.create(
        model="thinker",
        previous_response_id=response.id,
        input=[*sent_back, {"role": "user", "content": "thanks"}],
    )
    assert follow_up.output_text == "You said: thanks"


async def test_responses_streamed_reasoning_summary(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(model="thinker", input="what time is it?", stream=True)
    events = []
    async for event in stream:
        raw = event.model_dump(mode="json", exclude_unset=True, by_alias=True)
        assert type(EVENTS.validate_python(raw)) is type(event)
        events.append(event)
    deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(deltas) == "".join(THOUGHTS)
    done = [e.text for e in events if e.type == "response.reasoning_summary_text.done"]
    assert done == THOUGHTS
    parts = [e.type for e in events if e.type.startswith("response.reasoning_summary_part.")]
    assert (
        parts
        == ["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"] * 2
    )
    final = events[-1]
    assert final.type == "response.completed"
    assert _summaries(final.response) == THOUGHTS


async def test_chat_completions_reasoning_content(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": "what time is it?"}]
    )
    message = completion.choices[0].message
    assert message.content is not None and message.content.startswith("The time is ")
    # not a field of the SDK's model: read as the extra field it keeps
    assert (message.model_extra or {})["reasoning_content"] == "".join(THOUGHTS)
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 2 * CACHED_TOKENS
    assert usage.prompt_tokens_details.cache_write_tokens == 2 * CACHE_WRITE_TOKENS

    stream = await client.chat.completions.create(
        model="thinker",
        messages=[{"role": "user", "content": "what time is it?"}],
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    thought = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
        for c in chunks
        if c.choices
    )
    assert thought == "".join(THOUGHTS)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("The time is ")
