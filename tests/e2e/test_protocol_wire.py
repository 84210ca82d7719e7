"""The AG-UI and AI SDK endpoints on the wire, against a real server: every AG-UI event the
server sends validates with ``ag-ui-protocol``'s models; errors, auth, and a run that moves
between servers sharing Redis and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.agui import data_frames, validate_agui
from tests.support.server import Launch, Server
from tests.support.sse import read_events
from tests.support.waiting import wait_for

AGUI = "/v1/agents/default/ag-ui"
CHAT = "/v1/agents/default/ai-sdk/chat"


def _input(thread: str, text: str | None, **extra: Any) -> dict[str, Any]:
    messages = [] if text is None else [{"id": "u1", "role": "user", "content": text}]
    return {"threadId": thread, "runId": f"r-{thread}", "messages": messages, **extra}


async def _agui(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = await client.post(AGUI, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    events: list[dict[str, Any]] = data_frames(answer.content)
    validate_agui(events)
    assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    return events


def _resume(thread: str, call_id: str, approved: bool) -> dict[str, Any]:
    entry = {"interruptId": call_id, "status": "resolved", "payload": {"approved": approved}}
    return _input(thread, None, resume=[entry])


async def test_agui_events_validate_with_the_protocol_models(server: Server) -> None:
    async with server.client() as client:
        plain = await _agui(client, _input("wire-plain", "hello"))
        assert plain[0]["type"] == "RUN_STARTED"
        tool = await _agui(client, _input("wire-tool", "what time is it"))
        assert any(e["type"] == "TOOL_CALL_RESULT" for e in tool)
        asked = await _agui(client, _input("wire-ask", "delete a.txt"))
        call_id = asked[-1]["outcome"]["interrupts"][0]["id"]
        refused = await _agui(client, _input("wire-ask", "hello"))
        assert [e["type"] for e in refused] == ["RUN_ERROR"]
        resumed = await _agui(client, _resume("wire-ask", call_id, True))
        again = await _agui(client, _resume("wire-ask", call_id, False))
        assert resumed[1:] == again[1:]  # idempotent: the same rest of the run
        assert resumed[-1]["result"]["content"].startswith("Deleted a.txt")
        slow = "slow " * 20
        failed = await _agui(client, _input("wire-fail", slow, forwardedProps={"run_timeout": 0.3}))
        assert (failed[-1]["type"], failed[-1]["code"]) == ("RUN_ERROR", "run_timeout")

        # a cancel through the native API ends the AG-UI run as cancelled
        async with client.stream(
            "POST",
            AGUI,
            json=_input("wire-cancel", slow, forwardedProps={"on_disconnect": "continue"}),
        ) as stream:
            run_id = stream.headers["x-run-id"]
            cancel = await client.post(f"/v1/runs/{run_id}/cancel")
            assert cancel.status_code in (200, 202)
            cancelled = data_frames(await stream.aread())
        validate_agui(cancelled)
        assert cancelled[-1]["outcome"] == {"type": "cancelled"}


async def test_refusals_in_each_protocols_shape(server: Server) -> None:
    async with server.client() as client:
        unknown = await client.post("/v1/agents/nope/ag-ui", json=_input("e1", "hi"))
        assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")
        tools = await client.post(
            AGUI, json=_input("e1", "hi", tools=[{"name": "x", "description": "y"}])
        )
        assert tools.status_code == 422
        assert "client-side tools" in tools.json()["detail"]
        bad = await client.post(AGUI, json=_input("bad thread!", "hi"))
        assert bad.status_code == 422
        empty = await client.post(AGUI, json=_input("e1", None))
        assert empty.status_code == 422
        payload = _input("e1", None, resume=[{"interruptId": "x", "status": "resolved"}])
        assert (await client.post(AGUI, json=payload)).status_code == 422
        nothing = await _agui(client, _resume("e-none", "call_x", True))
        assert nothing[0]["code"] == "not_found"

        chat = {"id": "e2", "messages": [{"id": "a", "role": "assistant", "parts": []}]}
        assert (await client.post(CHAT, json=chat)).status_code == 422
        approval = {
            "id": "e2",
            "messages": [
                {
                    "id": "a",
                    "role": "assistant",
                    "parts": [
                        {
                            "type": "dynamic-tool",
                            "toolCallId": "call_x",
                            "state": "approval-responded",
                            "approval": {"id": "call_x", "approved": True},
                        }
                    ],
                }
            ],
        }
        assert (await client.post(CHAT, json=approval)).status_code == 404
        assert (await client.get(f"{CHAT}/e2/stream")).status_code == 204
        assert (await client.post(f"{CHAT}/e2/stop")).status_code == 204

        # a chat with an approval pending refuses a new message: 409 approval_pending
        first = {
            "id": "e3",
            "messages": [
                {"id": "u", "role": "user", "parts": [{"type": "text", "text": "delete b"}]}
            ],
        }
        asked = await client.post(CHAT, json=first)
        assert asked.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert data_frames(asked.content)[-1] == "[DONE]"
        busy = await client.post(CHAT, json=first)
        assert (busy.status_code, busy.json()["code"]) == (409, "approval_pending")


async def test_auth_and_ownership(start_server: Launch) -> None:
    server = start_server({"AGENT_API_KEYS": "key-a=alice,key-b=bob"})
    alice = {"Authorization": "Bearer key-a"}
    bob = {"Authorization": "Bearer key-b"}
    async with server.client() as client:
        assert (await client.post(AGUI, json=_input("own", "hi"))).status_code == 401
        assert (await client.get(f"{CHAT}/own/stream")).status_code == 401
        asked = await client.post(AGUI, json=_input("own", "delete c"), headers=alice)
        call_id = data_frames(asked.content)[-1]["outcome"]["interrupts"][0]["id"]
        taken = await client.post(AGUI, json=_input("own", "hi"), headers=bob)
        assert taken.status_code == 404
        stolen = await client.post(AGUI, json=_resume("own", call_id, True), headers=bob)
        assert data_frames(stolen.content)[0]["code"] == "not_found"
        assert (await client.get(f"{CHAT}/own/stream", headers=bob)).status_code == 204
        assert (await client.post(f"{CHAT}/own/stop", headers=bob)).status_code == 204
        done = await client.post(AGUI, json=_resume("own", call_id, True), headers=alice)
        assert data_frames(done.content)[-1]["outcome"] == {"type": "success"}


@pytest.mark.parametrize("backend", ["redis+postgres"], indirect=True)
async def test_a_protocol_run_moves_between_servers(start_server: Launch) -> None:
    slow = {"AGENT_DEMO_SLOW_SECONDS": "0.3"}
    one = start_server(slow)
    two = start_server(slow)
    async with one.client() as a, two.client() as b:
        # AG-UI: interrupted on one server, resumed through the other
        asked = await _agui(a, _input("moving", "delete d"))
        call_id = asked[-1]["outcome"]["interrupts"][0]["id"]
        resumed = await _agui(b, _resume("moving", call_id, True))
        assert resumed[-1]["result"]["content"].startswith("Deleted d")

        # AI SDK: the run streams on one server; the other resumes its stream from the start
        body = {
            "id": "moving-chat",
            "messages": [
                {"id": "u", "role": "user", "parts": [{"type": "text", "text": "slow x y z"}]}
            ],
        }
        async with a.stream("POST", CHAT, json=body) as first:
            run_id = first.headers["x-run-id"]
            replay = await b.get(f"{CHAT}/moving-chat/stream")
            assert replay.headers["x-run-id"] == run_id
            original = data_frames(await first.aread())
        assert data_frames(replay.content) == original
        assert original[-1] == "[DONE]"

        async def ended() -> bool:
            return (await b.get(f"{CHAT}/moving-chat/stream")).status_code == 204

        await wait_for(ended)
        events, _ = await read_events(b, "GET", f"/v1/runs/{run_id}/events")
        assert events[-1].type == "run.completed"

        # a client leaving a resumed stream served by the other server cancels the run there
        asked = await _agui(a, _input("moving-2", "slow: delete f"))
        call_id = asked[-1]["outcome"]["interrupts"][0]["id"]
        run_id = asked[0]["rawEvent"]["run_id"]
        async with b.stream(
            "POST", AGUI, json=_resume("moving-2", call_id, True)
        ) as resumed_stream:
            async for line in resumed_stream.aiter_lines():
                if "TEXT_MESSAGE_CONTENT" in line:
                    break
        events, _ = await read_events(a, "GET", f"/v1/runs/{run_id}/events")
        assert events[-1].type == "run.cancelled"
        assert events[-1].data["data"] == {"reason": "client_disconnected"}


def _chat(chat_id: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": chat_id, "messages": list(messages), **extra}


def _user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_ai_sdk_replays_a_pending_approval_and_answers_once(server: Server) -> None:
    async with server.client() as client:
        first = await client.post(CHAT, json=_chat("wire-chat", _user("delete e")))
        asked = data_frames(first.content)
        request = next(p for p in asked if p != "[DONE]" and p["type"] == "tool-approval-request")
        # the stream resumed while the run waits: replayed up to the same request, then ended
        replay = await client.get(f"{CHAT}/wire-chat/stream")
        assert replay.headers["x-run-id"] == first.headers["x-run-id"]
        assert data_frames(replay.content) == asked
        answered: dict[str, Any] = {
            "id": first.headers["x-run-id"],
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "delete_file",
                    "toolCallId": request["toolCallId"],
                    "state": "approval-responded",
                    "input": {"path": "e"},
                    "approval": {"id": request["approvalId"], "approved": True},
                }
            ],
        }
        body = _chat("wire-chat", _user("delete e"), answered)
        rest = data_frames((await client.post(CHAT, json=body)).content)
        kinds = [p if p == "[DONE]" else p["type"] for p in rest]
        assert kinds[0] == "start" and kinds[-2:] == ["finish", "[DONE]"]
        assert "tool-output-available" in kinds
        # the same answer again (or changed): the same rest of the run, nothing run twice
        answered["parts"][0]["approval"]["approved"] = False
        again = data_frames((await client.post(CHAT, json=body)).content)
        assert again == rest

        # regenerate: a new run for the last user turn
        regenerate = _chat("wire-chat", _user("hello"), trigger="regenerate-message")
        answer = await client.post(CHAT, json=regenerate)
        assert answer.headers["x-run-id"] != first.headers["x-run-id"]
        text = "".join(
            p["delta"] for p in data_frames(answer.content)[:-1] if p["type"] == "text-delta"
        )
        assert text == "You said: hello"
        # in place of the previous turn: the conversation holds one question and one answer
        stored = (await client.get("/v1/sessions/wire-chat/messages")).json()["messages"]
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[0]["content"] == "hello"
