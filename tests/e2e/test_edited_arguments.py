"""A person approving a tool call edits its arguments, where the agent's configuration allows
it (``editable_tools``), over HTTP to a real server: natively (``POST /external-events`` with
``arguments``) and as a LangGraph ``edit`` HumanResponse, through both official LangGraph
SDKs. The tool runs with the edited arguments, and the run's events, the stored conversation
and the thread's state show them; an edit the tool does not allow, or arguments it cannot
take, are refused (422) and the call keeps waiting.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.support import npm as npm_clients
from tests.support.npm import JS
from tests.support.problems import assert_problem
from tests.support.runs import follow, is_request, new_session
from tests.support.server import Server, launch
from tests.support.sse import Event, open_stream

# ``editor`` lets a person edit delete_file's arguments; ``default`` (the environment's) not
CONFIG = """
[agents.editor]
model = "demo"
tools = ["current_time", "delete_file"]
editable_tools = ["delete_file"]

[agents.editor.policies]
delete_file = "ask"
"""


@pytest.fixture(scope="module")
def edit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("edit-server")
    config = directory / "agents.toml"
    config.write_text(CONFIG, encoding="utf-8")
    server = launch(directory, {"AGENT_CONFIG": str(config), "AGENT_DEMO_TOKEN_DELAY": "0"})
    yield server
    server.stop()


# --- natively: POST /external-events ------------------------------------------------------


async def ask(client: httpx.AsyncClient, agent: str, text: str) -> tuple[str, str, Event]:
    """Start a background run of ``agent`` and read its events up to its question."""
    session = new_session()
    started = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": text, "agent": agent, "background": True}
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]
    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (_, stream):
        async for event in stream:
            if is_request(event):
                return session, run_id, event
    raise AssertionError("the run never asked")


def answer(
    session: str, run_id: str, asked: Event, arguments: Any = None, *, approved: bool = True
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "tool_call_id": asked.data["data"]["payload"]["tool_call_id"],
        "approved": approved,
    }
    if arguments is not None:
        payload["arguments"] = arguments
    return {
        "session_id": session,
        "run_id": run_id,
        "name": "confirmation_response",
        "payload": payload,
    }


async def test_an_approval_edits_the_arguments_of_an_editable_tool(edit_server: Server) -> None:
    async with edit_server.client() as client:
        session, run_id, asked = await ask(client, "editor", "delete draft.md")
        payload = asked.data["data"]["payload"]
        assert payload["editable"] is True and payload["arguments"] == {"path": "draft.md"}
        # arguments the tool cannot take, or an edit with a denial: 422, nothing used up
        for wrong, approved in (({"path": 5}, True), ({"name": "x"}, True), ({"path": "x"}, False)):
            refused = await client.post(
                "/external-events", json=answer(session, run_id, asked, wrong, approved=approved)
            )
            assert_problem(refused, 422, "invalid_arguments")
        assert (await client.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting"
        edited = answer(session, run_id, asked, {"path": "final.md"})
        accepted = await client.post("/external-events", json=edited)
        assert accepted.status_code == 202, accepted.text
        events = await follow(client, run_id)
        resolved = next(
            e.data["data"]["payload"]
            for e in events
            if e.type == "custom" and e.data["data"]["name"] == "confirmation_resolved"
        )
        assert resolved["edited"] is True and resolved["arguments"] == {"path": "final.md"}
        completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
        assert completed["result"] == "Deleted final.md"
        assert completed["edited"] is True and completed["arguments"] == {"path": "final.md"}
        assert events[-1].type == "run.completed"
        stored = (await client.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        calls = [m["tool_calls"] for m in stored if m.get("tool_calls")]
        assert [c["arguments"] for c in calls[0]] == [{"path": "final.md"}]
        tool = next(m for m in stored if m["role"] == "tool")
        assert tool["content"] == "Deleted final.md" and tool["approval"] == "approved"


async def test_an_edit_of_a_tool_that_allows_none_is_refused(edit_server: Server) -> None:
    async with edit_server.client() as client:
        session, run_id, asked = await ask(client, "default", "delete plans.md")
        assert "editable" not in asked.data["data"]["payload"]
        edit = answer(session, run_id, asked, {"path": "other.md"})
        assert_problem(await client.post("/external-events", json=edit), 422, "edit_not_allowed")
        accepted = await client.post("/external-events", json=answer(session, run_id, asked))
        assert accepted.status_code == 202
        events = await follow(client, run_id)
        completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
        assert completed["result"] == "Deleted plans.md" and "edited" not in completed


async def test_a_denial_with_a_reply_answers_in_the_calls_place(edit_server: Server) -> None:
    async with edit_server.client() as client:
        session, run_id, asked = await ask(client, "default", "delete notes.md")
        denial = answer(session, run_id, asked, approved=False)
        for wrong in ("", 7):
            denial["payload"]["response"] = wrong
            assert_problem(
                await client.post("/external-events", json=denial), 422, "invalid_response"
            )
        approval = answer(session, run_id, asked)
        approval["payload"]["response"] = "yes please"
        assert_problem(
            await client.post("/external-events", json=approval), 422, "invalid_response"
        )
        assert (await client.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting"
        denial["payload"]["response"] = "keep it, move it to the archive instead"
        accepted = await client.post("/external-events", json=denial)
        assert accepted.status_code == 202, accepted.text
        events = await follow(client, run_id)
        resolved = next(
            e.data["data"]["payload"]
            for e in events
            if e.type == "custom" and e.data["data"]["name"] == "confirmation_resolved"
        )
        assert resolved["outcome"] == "denied"
        assert resolved["response"] == "keep it, move it to the archive instead"
        completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
        assert completed["is_error"] is True
        assert "move it to the archive instead" in completed["error"]


# --- LangGraph: the Python SDK -------------------------------------------------------------


@pytest.fixture
async def lg(edit_server: Server) -> AsyncIterator[LangGraphClient]:
    sdk = get_client(url=f"{edit_server.base_url}/langgraph")
    yield sdk
    await sdk.aclose()


def _human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def _edit(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Agent Inbox's HumanResponse for an edit: its ``args`` is an ActionRequest."""
    return {"type": "edit", "args": {"action": tool, "args": args}}


async def _interrupt(lg: LangGraphClient, thread_id: str, assistant: str, text: str) -> Any:
    parts = [
        p
        async for p in lg.runs.stream(
            thread_id, assistant, input=_human(text), stream_mode="updates"
        )
    ]
    found = [p.data["__interrupt__"][0] for p in parts if "__interrupt__" in (p.data or {})]
    assert found, [p.event for p in parts]
    return found[0]


async def test_langgraph_edit_runs_the_tool_with_the_edited_arguments(lg: LangGraphClient) -> None:
    thread: Any = await lg.threads.create()
    tid = thread["thread_id"]
    interrupt = await _interrupt(lg, tid, "editor", "delete draft.md")
    assert interrupt["value"]["config"]["allow_edit"] is True
    assert interrupt["value"]["action_request"] == {
        "action": "delete_file",
        "args": {"path": "draft.md"},
    }
    # arguments the tool's schema refuses: 422, and the interrupt still waits
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await lg.runs.wait(tid, "editor", command={"resume": [_edit("delete_file", {"path": 7})]})
    assert refused.value.response.status_code == 422
    assert refused.value.response.json()["code"] == "invalid_arguments"
    with pytest.raises(httpx.HTTPStatusError) as other_tool:
        await lg.runs.wait(tid, "editor", command={"resume": [_edit("current_time", {})]})
    assert other_tool.value.response.json()["code"] == "answer_not_allowed"
    assert (await lg.threads.get(tid))["status"] == "interrupted"

    parts = [
        p
        async for p in lg.runs.stream(
            tid,
            "editor",
            command={"resume": [_edit("delete_file", {"path": "final.md"})]},
            stream_mode=["values", "updates"],
        )
    ]
    tool_updates = [p.data["tools"]["messages"][0] for p in parts if "tools" in (p.data or {})]
    assert tool_updates[0]["content"] == "Deleted final.md"
    last = [p.data for p in parts if p.event == "values"][-1]
    ai_calls = [m["tool_calls"] for m in last["messages"] if m["type"] == "ai" and m["tool_calls"]]
    assert ai_calls[0][0]["args"] == {"path": "final.md"}

    state: Any = await lg.threads.get_state(tid)
    messages = state["values"]["messages"]
    ai = next(m for m in messages if m["type"] == "ai" and m["tool_calls"])
    assert ai["tool_calls"][0]["args"] == {"path": "final.md"}
    assert next(m for m in messages if m["type"] == "tool")["content"] == "Deleted final.md"
    history: Any = await lg.threads.get_history(tid)
    newest = history[0]["values"]["messages"]
    assert [
        m["tool_calls"][0]["args"] for m in newest if m["type"] == "ai" and m["tool_calls"]
    ] == [{"path": "final.md"}]


async def test_langgraph_edit_refused_where_the_tool_allows_none(lg: LangGraphClient) -> None:
    thread: Any = await lg.threads.create()
    tid = thread["thread_id"]
    interrupt = await _interrupt(lg, tid, "default", "delete plans.md")
    assert interrupt["value"]["config"]["allow_edit"] is False
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await lg.runs.wait(
            tid, "default", command={"resume": [_edit("delete_file", {"path": "other.md"})]}
        )
    assert refused.value.response.status_code == 422
    assert refused.value.response.json()["code"] == "answer_not_allowed"
    result: Any = await lg.runs.wait(tid, "default", command={"resume": {"type": "accept"}})
    assert "Deleted plans.md" in result["messages"][-1]["content"]
    ai = next(m for m in result["messages"] if m["type"] == "ai" and m["tool_calls"])
    assert ai["tool_calls"][0]["args"] == {"path": "plans.md"}


# --- LangGraph: the JS SDK -----------------------------------------------------------------


def _node(server: Server, scenario: str) -> dict[str, Any]:
    done = subprocess.run(
        [npm_clients.node(), str(JS / "langgraph_scenarios.mjs"), server.base_url, scenario],
        cwd=Path(JS),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr}\n{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_js_client_edits_an_interrupt_and_is_refused_where_not_allowed(
    edit_server: Server,
) -> None:
    result = _node(edit_server, "edit")
    assert result["allowEdit"] == {"editor": True, "default": False}
    assert result["streamedArgs"] == {"path": "final.md"}
    assert result["stateArgs"] == {"path": "final.md"}
    assert result["toolResult"] == "Deleted final.md"
    assert result["refused"]["status"] == 422
    assert '"code":"answer_not_allowed"' in result["refused"]["message"].replace(" ", "")
    assert result["afterRefusal"] == "interrupted"
