"""AG-UI and the AI SDK's UI message stream, driven by their official npm clients (unmodified,
pinned in tests/js) against a real server process.

Each scenario is a Node script (tests/js/*_scenarios.mjs) that checks what the client saw and
prints it as JSON; the server's side of the story (the run's status, its native events) is
checked here.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx

from tests.support import npm as npm_clients
from tests.support.npm import JS
from tests.support.server import Launch, Server
from tests.support.sse import read_events
from tests.support.waiting import wait_for


def node(script: str, server: Server, scenario: str) -> dict[str, Any]:
    """Run one scenario of ``tests/js/<script>_scenarios.mjs``; what it printed."""
    done = subprocess.run(
        [npm_clients.node(), str(JS / f"{script}_scenarios.mjs"), server.base_url, scenario],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{script} {scenario} failed:\n{done.stderr}\n{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def _ended_as(server: Server, run_id: str) -> tuple[str, dict[str, Any]]:
    """The run's final status and its terminal event's data, once it ended."""
    async with server.client() as client:

        async def finished() -> dict[str, Any] | None:
            view: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
            return view if view["status"] in ("completed", "failed", "cancelled") else None

        view = await wait_for(finished)
        events, _ = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    return view["status"], events[-1].data["data"]


# --- AG-UI: @ag-ui/client HttpAgent --------------------------------------------------------


def test_agui_run(server: Server) -> None:
    result = node("agui", server, "run")
    assert result["text"] == "You said: hello there"
    assert result["usage"][0]["model"] == "demo"
    assert result["usage"][0]["totalTokens"] > 0


def test_agui_tool_call(server: Server) -> None:
    result = node("agui", server, "tool")
    assert result["text"].startswith("The time is ")
    assert result["types"][1:5] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]


def test_agui_interrupt_answered_by_resume(server: Server) -> None:
    result = node("agui", server, "interrupt")
    assert result["interrupt"]["metadata"] == {
        "tool": "delete_file",
        "arguments": {"path": "notes.txt"},
    }
    assert result["refused"]["code"] == "interrupt_pending"
    assert "Deleted notes.txt" in result["text"]
    # the repeated resume replays the same end of the run
    assert result["repeatedText"] == result["text"]


def test_agui_interrupt_denied(server: Server) -> None:
    result = node("agui", server, "deny")
    assert "did not delete secrets.txt" in result["text"]


async def test_agui_abort_cancels_the_run(server: Server) -> None:
    result = node("agui", server, "abort")
    status, data = await _ended_as(server, result["runId"])
    assert status == "cancelled"
    assert data == {"reason": "client_disconnected"}


async def test_agui_overloaded_is_an_error(start_server: Launch) -> None:
    server = start_server({"AGENT_MAX_CONCURRENT_RUNS": "1", "AGENT_MAX_QUEUED_RUNS": "0"})
    async with server.client() as client:
        held = await client.post(
            "/v1/sessions/holder/runs", json={"input": "delete held.txt", "background": True}
        )
        assert held.status_code == 202
        result = node("agui", server, "overloaded")
        ai = node("ai_sdk", server, "overloaded")
        # an answer to the waiting run still goes through the full worker
        answer = await client.post(
            "/v1/agents/default/ag-ui",
            json={
                "threadId": "holder",
                "runId": "r2",
                "messages": [],
                "resume": [
                    {
                        "interruptId": await _pending_call(client, held.json()["run_id"]),
                        "status": "resolved",
                        "payload": {"approved": False},
                    }
                ],
            },
        )
        assert answer.status_code == 200
        assert '"RUN_FINISHED"' in answer.text
    assert result["status"] == 429
    # problem+json: the client hands the body over as text
    assert json.loads(result["payload"])["code"] == "overloaded"
    assert ai["status"] == 429


async def _pending_call(client: httpx.AsyncClient, run_id: str) -> str:
    async def asked() -> str | None:
        events, _ = await read_events(client, "GET", f"/v1/runs/{run_id}/events", stop_after=4)
        for event in events:
            if event.type == "custom":
                call_id: str = event.data["data"]["payload"]["tool_call_id"]
                return call_id
        return None

    found: str = await wait_for(asked)
    return found


# --- AI SDK: npm ai (DefaultChatTransport, readUIMessageStream, the Chat of useChat) ---------


def test_ai_sdk_text(server: Server) -> None:
    result = node("ai_sdk", server, "text")
    assert [c["type"] for c in result["chunks"]][:3] == ["start", "start-step", "text-start"]
    assert result["message"]["metadata"]["usage"]["totalTokens"] > 0


def test_ai_sdk_tool_parts(server: Server) -> None:
    result = node("ai_sdk", server, "tools")
    parts = result["message"]["parts"]
    assert [p["type"] for p in parts] == ["step-start", "dynamic-tool", "step-start", "text"]


def test_ai_sdk_approval_answered(server: Server) -> None:
    result = node("ai_sdk", server, "approval")
    # the answer continues the same assistant message (its id is the run's)
    assert result["approved"]["answer"]["id"] == result["approved"]["asked"]["id"]
    assert result["approved"]["messages"] == 2


def test_ai_sdk_resume_and_idle(server: Server) -> None:
    result = node("ai_sdk", server, "resume")
    assert result["replay"]["parts"][-1]["text"].startswith("You said: a slow one w0 w1")


async def test_ai_sdk_stop(server: Server) -> None:
    result = node("ai_sdk", server, "stop")
    status, data = await _ended_as(server, result["runId"])
    assert (status, data) == ("cancelled", {"reason": "client_disconnected"})
    status, data = await _ended_as(server, result["stoppedRun"])
    assert (status, data) == ("cancelled", {"reason": "cancel_requested"})
