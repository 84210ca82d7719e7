"""A model's reasoning on the LangGraph API, read with the official ``langgraph-sdk``: streamed
as LangChain's standard ``reasoning`` content blocks ahead of the text, and kept in the thread's
state as the AI message's first block. The ``thinker`` agent reasons before each answer
(``tests/fakes/reasoning_models.py``); its signed reasoning state never reaches a client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.fakes.reasoning_models import SIGNATURE_PREFIX
from tests.support.server import Server, launch

pytestmark = pytest.mark.e2e

AGENTS = """
[agents.thinker]
model = "python:tests.fakes.reasoning_models:thinker"
"""


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("langgraph-thinking")
    config = directory / "agents.toml"
    config.write_text(AGENTS, encoding="utf-8")
    server = launch(
        directory / "server", {"AGENT_CONFIG": str(config), "AGENT_DEMO_TOKEN_DELAY": "0"}
    )
    yield server
    server.stop()


@pytest.fixture
async def client(thinking_server: Server) -> AsyncIterator[LangGraphClient]:
    sdk = get_client(url=f"{thinking_server.base_url}/langgraph")
    yield sdk
    await sdk.aclose()


async def test_reasoning_streams_as_blocks_and_stays_in_the_state(
    client: LangGraphClient,
) -> None:
    thread: Any = await client.threads.create()
    prompt: Any = {"messages": [{"role": "user", "content": "hello there"}]}
    parts = [
        part
        async for part in client.runs.stream(
            thread["thread_id"],
            "thinker",
            input=prompt,
            stream_mode=["messages-tuple", "values"],
        )
    ]
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    reasoning = [
        block["reasoning"]
        for chunk in chunks
        if isinstance(chunk["content"], list)
        for block in chunk["content"]
        if block["type"] == "reasoning"
    ]
    text = [
        block["text"]
        for chunk in chunks
        if isinstance(chunk["content"], list)
        for block in chunk["content"]
        if block["type"] == "text"
    ]
    assert "".join(reasoning) == 'Thinking about "hello there", step 1.'
    assert "".join(text) == "You said: hello there"
    # every chunk of the message is a block with its index: they merge into the message
    assert all(isinstance(chunk["content"], list) for chunk in chunks)
    first_text = next(i for i, c in enumerate(chunks) if c["content"][0]["type"] == "text")
    assert all(c["content"][0]["type"] == "reasoning" for c in chunks[:first_text])
    expected = [
        {"type": "reasoning", "reasoning": 'Thinking about "hello there", step 1.', "index": 0},
        {"type": "text", "text": "You said: hello there", "index": 1},
    ]
    last_values = [p.data for p in parts if p.event == "values"][-1]
    assert last_values["messages"][-1]["content"] == expected
    # the stored conversation says the same; the signed state stays on the server
    state: Any = await client.threads.get_state(thread["thread_id"])
    assert state["values"]["messages"][-1]["content"] == expected
    assert SIGNATURE_PREFIX not in json.dumps(state)
    history: Any = await client.threads.get_history(thread["thread_id"])
    assert SIGNATURE_PREFIX not in json.dumps(history)
