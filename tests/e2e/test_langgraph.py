"""The LangGraph-compatible API, driven by the official ``langgraph-sdk`` against a real server.

Assistants are the configured agents; threads are sessions (with metadata, search, state and
a history of checkpoints); runs stream in LangGraph's stream modes, wait, join and cancel;
the demo's ``delete NAME`` confirmation is an interrupt answered with ``command.resume``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

from tests.support import npm as npm_clients
from tests.support.files import pdf, png
from tests.support.npm import JS
from tests.support.server import Server, launch

KEY = "sk-langgraph-alice"
OTHER_KEY = "sk-langgraph-bob"


@pytest.fixture(scope="module")
def lg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("langgraph-server"),
        {"AGENT_API_KEYS": f"{KEY}=alice,{OTHER_KEY}=bob", "AGENT_DEMO_TOKEN_DELAY": "0"},
    )
    yield server
    server.stop()


def _client(server: Server, key: str) -> LangGraphClient:
    return get_client(
        url=f"{server.base_url}/langgraph", api_key=key, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.fixture
async def client(lg_server: Server) -> AsyncIterator[LangGraphClient]:
    sdk = _client(lg_server, KEY)
    yield sdk
    await sdk.aclose()


def _human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def _texts(values: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m["type"], m["content"]) for m in values["messages"]]


async def test_assistants_are_the_agents(client: LangGraphClient) -> None:
    found = await client.assistants.search()
    assert [a["assistant_id"] for a in found] == ["default"]
    assistant: Any = await client.assistants.get("default")
    assert assistant["graph_id"] == "default"
    schemas: Any = await client.assistants.get_schemas("default")
    assert schemas["input_schema"]["required"] == ["messages"]
    with pytest.raises(NotFoundError):
        await client.assistants.get("nobody")


async def test_threads_with_metadata_search_and_state(client: LangGraphClient) -> None:
    thread: Any = await client.threads.create(metadata={"topic": "birds", "owner_tag": 7})
    other: Any = await client.threads.create(metadata={"topic": "fish"})
    assert thread["status"] == "idle" and thread["metadata"]["topic"] == "birds"
    found: Any = await client.threads.search(metadata={"topic": "birds"})
    assert [t["thread_id"] for t in found] == [thread["thread_id"]]
    assert other["thread_id"] not in [t["thread_id"] for t in found]

    result: Any = await client.runs.wait(
        thread["thread_id"], "default", input=_human("hello there")
    )
    assert isinstance(result, dict)
    assert _texts(result) == [("human", "hello there"), ("ai", "You said: hello there")]

    state: Any = await client.threads.get_state(thread["thread_id"])
    assert _texts(state["values"])[-1] == ("ai", "You said: hello there")
    assert state["next"] == [] and state["checkpoint"]["checkpoint_id"]

    await client.runs.wait(thread["thread_id"], "default", input=_human("and again"))
    history: Any = await client.threads.get_history(thread["thread_id"])
    assert len(history) == 2
    newest, oldest = history
    assert newest["parent_checkpoint"]["checkpoint_id"] == oldest["checkpoint"]["checkpoint_id"]
    assert len(newest["values"]["messages"]) == 4 and len(oldest["values"]["messages"]) == 2

    # the SDK types copy() as answering nothing; LangGraph's server answers the new thread
    copy: Any = client.threads.copy
    copied = await copy(thread["thread_id"])
    assert _texts(copied["values"]) == _texts(newest["values"])

    updated: Any = await client.threads.update(thread["thread_id"], metadata={"topic": "owls"})
    assert updated["metadata"] == {"topic": "owls", "owner_tag": 7}


async def test_stream_values_and_message_tuples(client: LangGraphClient) -> None:
    thread: Any = await client.threads.create()
    parts = [
        part
        async for part in client.runs.stream(
            thread["thread_id"],
            "default",
            input=_human("stream these words"),
            stream_mode=["values", "messages-tuple"],
        )
    ]
    events = [p.event for p in parts]
    assert events[0] == "metadata"
    run_id = parts[0].data["run_id"]
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    assert "".join(c["content"] for c in chunks) == "You said: stream these words"
    assert {c["id"] for c in chunks} == {f"{run_id}-1"}
    last_values = [p.data for p in parts if p.event == "values"][-1]
    assert last_values["messages"][-1]["content"] == "You said: stream these words"
    # the streamed message and the stored one have the same id
    state: Any = await client.threads.get_state(thread["thread_id"])
    assert state["values"]["messages"][-1]["id"] == f"{run_id}-1"


async def test_background_run_join_and_list(client: LangGraphClient) -> None:
    thread: Any = await client.threads.create()
    run: Any = await client.runs.create(thread["thread_id"], "default", input=_human("in the back"))
    assert run["status"] in ("pending", "running", "success")
    values: Any = await client.runs.join(thread["thread_id"], run["run_id"])
    assert values["messages"][-1]["content"] == "You said: in the back"
    fetched: Any = await client.runs.get(thread["thread_id"], run["run_id"])
    assert fetched["status"] == "success"
    listed: Any = await client.runs.list(thread["thread_id"])
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    joined = [p async for p in client.runs.join_stream(thread["thread_id"], run["run_id"])]
    assert joined[-1].event == "values"
    assert joined[-1].data["messages"][-1]["content"] == "You said: in the back"


async def test_interrupt_accepted_and_ignored(client: LangGraphClient) -> None:
    thread: Any = await client.threads.create()
    tid = thread["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            tid, "default", input=_human("please delete notes.txt"), stream_mode="updates"
        )
    ]
    interrupts = [
        p.data["__interrupt__"] for p in parts if p.event == "updates" and "__interrupt__" in p.data
    ]
    assert interrupts, [p.event for p in parts]
    interrupt = interrupts[0][0]
    assert interrupt["value"]["action_request"] == {
        "action": "delete_file",
        "args": {"path": "notes.txt"},
    }
    assert interrupt["value"]["config"]["allow_accept"] is True
    state: Any = await client.threads.get_state(tid)
    assert (
        state["next"] == ["agent"] and state["tasks"][0]["interrupts"][0]["id"] == interrupt["id"]
    )
    assert (await client.threads.get(tid))["status"] == "interrupted"
    # an edit is not offered for a call the server holds
    # (runs.wait raises httpx's error where the other calls raise the SDK's own)
    with pytest.raises((UnprocessableEntityError, httpx.HTTPStatusError)) as refused:
        await client.runs.wait(
            tid, "default", command={"resume": [{"type": "edit", "args": {"path": "x"}}]}
        )
    assert "422" in str(refused.value)
    result: Any = await client.runs.wait(
        tid, "default", command={"resume": [{"type": "accept", "args": None}]}
    )
    assert "Deleted notes.txt" in result["messages"][-1]["content"]
    assert (await client.threads.get(tid))["status"] == "idle"

    await client.runs.wait(tid, "default", input=_human("delete old.log"))
    ignored: Any = await client.runs.wait(tid, "default", command={"resume": {"type": "ignore"}})
    assert "did not delete old.log" in ignored["messages"][-1]["content"]


async def test_interrupt_answered_with_a_reply(client: LangGraphClient) -> None:
    # Agent Inbox's "response": the tool does not run; the model gets the reply in its place
    thread: Any = await client.threads.create()
    tid = thread["thread_id"]
    waiting: Any = await client.runs.wait(tid, "default", input=_human("delete draft.md"))
    assert waiting["__interrupt__"][0]["value"]["config"]["allow_respond"] is True
    with pytest.raises((UnprocessableEntityError, httpx.HTTPStatusError)) as refused:
        await client.runs.wait(tid, "default", command={"resume": {"type": "response"}})
    assert "422" in str(refused.value)
    reply = "keep it, I still need the draft"
    result: Any = await client.runs.wait(
        tid, "default", command={"resume": {"type": "response", "args": reply}}
    )
    tool = next(m for m in result["messages"] if m["type"] == "tool")
    assert reply in tool["content"] and tool["status"] == "error"
    assert not any("Deleted draft.md" in str(m["content"]) for m in result["messages"])
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_another_principal_sees_nothing(lg_server: Server, client: LangGraphClient) -> None:
    thread: Any = await client.threads.create(metadata={"secret": "yes"})
    await client.runs.wait(thread["thread_id"], "default", input=_human("mine"))
    bob = _client(lg_server, OTHER_KEY)
    try:
        with pytest.raises(NotFoundError):
            await bob.threads.get(thread["thread_id"])
        with pytest.raises(NotFoundError):
            await bob.threads.get_state(thread["thread_id"])
        with pytest.raises((NotFoundError, httpx.HTTPStatusError)) as refused:
            await bob.runs.wait(thread["thread_id"], "default", input=_human("theirs"))
        assert "404" in str(refused.value)
        assert await bob.threads.search(metadata={"secret": "yes"}) == []
    finally:
        await bob.aclose()


async def test_unoffered_routes_say_so(lg_server: Server) -> None:
    async with httpx.AsyncClient(base_url=f"{lg_server.base_url}/langgraph") as http:
        answer = await http.post("/runs/crons", json={}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 404
    assert "not offered" in answer.json()["detail"]


# --- the JS client: @langchain/langgraph-sdk ------------------------------------------------


def _node(server: Server, scenario: str) -> dict[str, Any]:
    done = subprocess.run(
        [npm_clients.node(), str(JS / "langgraph_scenarios.mjs"), server.base_url, scenario],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr}\n{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_js_client_streams_searches_and_reads_history(server: Server) -> None:
    result = _node(server, "stream")
    assert result == {
        "text": "You said: hello from js",
        "last": "You said: hello from js",
        "found": True,
        "checkpoints": 1,
    }


def test_js_client_answers_an_interrupt(server: Server) -> None:
    result = _node(server, "interrupt")
    assert result["action"] == {"action": "delete_file", "args": {"path": "draft.md"}}
    assert "Deleted draft.md" in result["answer"]
    assert result["status"] == "idle"


async def test_a_fork_from_an_earlier_checkpoint(client: LangGraphClient) -> None:
    thread: Any = await client.threads.create()
    tid = thread["thread_id"]
    await client.runs.wait(tid, "default", input=_human("first"))
    await client.runs.wait(tid, "default", input=_human("second"))
    history: Any = await client.threads.get_history(tid)
    first = history[-1]["checkpoint"]["checkpoint_id"]
    forked: Any = await client.runs.wait(
        tid, "default", input=_human("instead"), checkpoint_id=first
    )
    # the branch holds the first turn and the new one, never the second
    assert _texts(forked) == [
        ("human", "first"),
        ("ai", "You said: first"),
        ("human", "instead"),
        ("ai", "You said: instead"),
    ]
    history = await client.threads.get_history(tid)
    assert len(history) == 3
    newest = history[0]
    assert newest["parent_checkpoint"]["checkpoint_id"] == first
    # the other branch stays readable
    second = [h for h in history if h["values"]["messages"][-1]["content"] == "You said: second"]
    assert len(second) == 1 and second[0]["parent_checkpoint"]["checkpoint_id"] == first
    # the thread goes on from the fork: the model sees the branch only
    after: Any = await client.runs.wait(tid, "default", input=_human("then"))
    assert [m["content"] for m in after["messages"] if m["type"] == "human"] == [
        "first",
        "instead",
        "then",
    ]
    with pytest.raises((NotFoundError, httpx.HTTPStatusError)):
        await client.runs.wait(tid, "default", input=_human("x"), checkpoint_id=str(uuid.uuid4()))


async def test_images_and_documents_in_langchain_content_blocks(client: LangGraphClient) -> None:
    image, document = png(), pdf()
    thread: Any = await client.threads.create()
    content: Any = [
        {"type": "text", "text": "what are these?"},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()},
        },
        {
            "type": "file",
            "source_type": "base64",
            "data": base64.b64encode(document).decode(),
            "mime_type": "application/pdf",
            "filename": "doc.pdf",
        },
    ]
    asked: Any = {"messages": [{"role": "user", "content": content}]}
    result: Any = await client.runs.wait(thread["thread_id"], "default", input=asked)
    answer = result["messages"][-1]["content"]
    assert f"image (image/png, {len(image)} bytes" in answer
    assert f"document (application/pdf, {len(document)} bytes" in answer
    human = result["messages"][0]["content"]
    # stored once, by reference: the state's blocks point at the stored files, never bytes
    assert [b["type"] for b in human] == ["text", "image", "file"]
    assert all(b["url"].startswith("/v1/files/file_") for b in human[1:])
    # a block no model here can take is refused, not dropped
    audio: Any = {
        "messages": [
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "A"}}]}
        ]
    }
    with pytest.raises((UnprocessableEntityError, httpx.HTTPStatusError)) as refused:
        await client.runs.wait(
            thread["thread_id"],
            "default",
            input=audio,
        )
    assert "415" in str(refused.value) or "422" in str(refused.value)
