"""The authorization matrix of the protocol paths: another principal naming the owner's objects.

On every protocol (OpenAI Responses and Chat Completions, A2A over JSON-RPC and HTTP+JSON,
AG-UI, the AI SDK chat stream, MCP) bob, with his own valid key and his own sessions and
waiting run, names alice's objects every way the protocol lets a request name one: he reads
them, continues them, cancels them, and answers her pending confirmation through the
protocol's own answer, naming her ids and naming his own session (or run) with her run, task
or call id. Each attempt gets the protocol's own not-found (or refusal), in exactly the shape an
id that never existed gets (bar the id in the text), so that bob cannot tell her objects exist;
where naming an unknown session would start bob's own run (a conversation, a thread, a
context), the owner's session is the protocol's not-found. Afterwards alice's waiting run still
waits, her sessions hold what they held, and her own answer still gets through: the run
completes with the tool run once.

Two layouts: one worker on the default backend (SQLite, the in-process bus), and two server
processes on Redis and PostgreSQL, alice's objects made through the first and bob's attempts
sent to the second.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import httpx
import httpx2
import mcp_types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.auth import KEYS, auth
from tests.support.authz import Layout
from tests.support.problems import assert_problem
from tests.support.server import Server
from tests.support.sse import open_stream, read_events

AGENT = "default"
A2A_VERSION = {"A2A-Version": "1.0"}
# an attempt that streams instead of being refused would otherwise wait for the confirmation
ATTEMPT_TIMEOUT = 15.0


# --- what alice and bob own ----------------------------------------------------------------------


@dataclass(frozen=True)
class Owned:
    """A principal's objects: a completed run in a session, and a run in another session
    waiting for the confirmation of ``call_id`` (asked at event ``seq``)."""

    done_session: str
    done_run: str
    wait_session: str
    wait_run: str
    call_id: str
    seq: int

    @property
    def done_response(self) -> str:
        return response_id(self.done_run)

    @property
    def wait_response(self) -> str:
        return response_id(self.wait_run)


def response_id(run_id: str) -> str:
    """The OpenAI Responses id of a run's first response."""
    return "resp_" + run_id.removeprefix("run_")


def nobody() -> Owned:
    """Ids of the same forms that were never created."""
    return Owned(
        done_session=f"nobody-{secrets.token_hex(4)}",
        done_run=f"run_{secrets.token_hex(16)}",
        wait_session=f"nobody-wait-{secrets.token_hex(4)}",
        wait_run=f"run_{secrets.token_hex(16)}",
        call_id=f"call_{secrets.token_hex(12)}",
        seq=7,
    )


async def confirmation_asked(client: httpx.AsyncClient, run_id: str) -> tuple[str, int]:
    """The tool call id of the confirmation the run asks for, and the seq of the question."""
    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (_, events):
        async for event in events:
            if event.type == "custom" and event.data["data"]["name"] == "confirmation_requested":
                return str(event.data["data"]["payload"]["tool_call_id"]), event.id
    raise AssertionError("the run never asked for a confirmation")


async def make_objects(server: Server, principal: str) -> Owned:
    """A completed run, and a background run waiting for the demo model's ``delete_file``."""
    async with server.client(headers=auth(principal)) as client:
        done_session = f"{principal}-{uuid.uuid4().hex[:8]}"
        done = await client.post(
            f"/v1/sessions/{done_session}/runs", json={"input": "hello", "stream": False}
        )
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        wait_session = f"{principal}-wait-{uuid.uuid4().hex[:8]}"
        started = await client.post(
            f"/v1/sessions/{wait_session}/runs",
            json={"input": "delete secret.txt", "background": True},
        )
        assert started.status_code == 202, started.text
        wait_run: str = started.json()["run_id"]
        async with asyncio.timeout(15):
            call_id, seq = await confirmation_asked(client, wait_run)
        return Owned(done_session, done.headers["x-run-id"], wait_session, wait_run, call_id, seq)


@dataclass(frozen=True)
class World:
    """Alice's objects (made through the owner worker), bob's (through the other), the
    message counts of alice's sessions, and ids of the same forms that never existed."""

    layout: Layout
    alice: Owned
    bob: Owned
    counts: dict[str, int]
    twin: Owned


async def message_counts(server: Server, owned: Owned) -> dict[str, int]:
    async with server.client(headers=auth("alice")) as client:
        counts = {}
        for session in (owned.done_session, owned.wait_session):
            answer = await client.get(f"/v1/sessions/{session}")
            assert answer.status_code == 200, answer.text
            counts[session] = answer.json()["message_count"]
        return counts


@pytest.fixture
async def world(layout: Layout) -> AsyncIterator[World]:
    alice, bob = await asyncio.gather(
        make_objects(layout.owner, "alice"), make_objects(layout.other, "bob")
    )
    counts = await message_counts(layout.owner, alice)
    assert counts == {alice.done_session: 2, alice.wait_session: 0}
    # the twin asks at the same seq: a response id carries it
    yield World(layout, alice, bob, counts, replace(nobody(), seq=alice.seq))
    for server, principal, owned in ((layout.owner, "alice", alice), (layout.other, "bob", bob)):
        async with server.client(headers=auth(principal)) as client:
            await client.post(f"/v1/runs/{owned.wait_run}/cancel")


async def alice_keeps_everything(world: World) -> None:
    """Alice's runs and sessions are as she left them, and her own answer gets through: the
    run completes with the tool run once."""
    alice = world.alice
    async with world.layout.owner.client(headers=auth("alice")) as client:
        waiting = (await client.get(f"/v1/runs/{alice.wait_run}")).json()
        assert waiting["status"] == "waiting", waiting
        done = (await client.get(f"/v1/runs/{alice.done_run}")).json()
        assert done["status"] == "completed", done
    assert await message_counts(world.layout.owner, alice) == world.counts
    # the answer through the worker bob spoke to: nothing of bob's is left there in its way
    async with world.layout.other.client(headers=auth("alice")) as client:
        answer = {
            "session_id": alice.wait_session,
            "run_id": alice.wait_run,
            "name": "confirmation_response",
            "payload": {"tool_call_id": alice.call_id, "approved": True},
        }
        accepted = await client.post("/external-events", json=answer)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}
        async with asyncio.timeout(15):
            events, _ = await read_events(client, "GET", f"/v1/runs/{alice.wait_run}/events")
    assert events[-1].type == "run.completed", events[-1]
    assert "Deleted secret.txt" in events[-1].data["data"]["output"]["content"]
    ran = [e.data["data"] for e in events if e.type == "tool.call.completed"]
    assert [(r["tool_call_id"], r["name"], r["is_error"]) for r in ran] == [
        (alice.call_id, "delete_file", False)
    ]
    resolved = [
        e.data["data"]["payload"]
        for e in events
        if e.type == "custom" and e.data["data"]["name"] == "confirmation_resolved"
    ]
    assert resolved == [{"tool_call_id": alice.call_id, "outcome": "approved"}]


async def bob_still_waits(world: World) -> None:
    """Bob's own waiting run took nothing that named alice's call."""
    async with world.layout.other.client(headers=auth("bob")) as client:
        run = (await client.get(f"/v1/runs/{world.bob.wait_run}")).json()
    assert run["status"] == "waiting", run


# --- one attempt, and the same attempt with ids that never existed -----------------------------


Check = Callable[[httpx.Response], None]
"""An assertion about the answer to an attempt (the protocol's refusal)."""


@dataclass(frozen=True)
class Attempt:
    """One request of bob's naming alice's objects (``twin``: compare it with the same request
    naming ids that never existed)."""

    cell: str
    method: str
    path: str
    body: Any
    expect: Check
    twin: bool = True


Attempts = Callable[[Owned, Owned], list[Attempt]]


def normalized(text: str, *worlds: Owned) -> str:
    """``text`` with every id of ``worlds`` replaced by the name of its field."""
    replacements: list[tuple[str, str]] = []
    for owned in worlds:
        for field in fields(owned):
            value = getattr(owned, field.name)
            if isinstance(value, str):
                replacements.append((value.removeprefix("run_"), f"<{field.name}>"))
    for value, name in sorted(replacements, key=lambda pair: -len(pair[0])):
        text = text.replace(value, name)
    return text


async def attempt(client: httpx.AsyncClient, call: Attempt) -> httpx.Response:
    async with asyncio.timeout(ATTEMPT_TIMEOUT):
        return await client.request(call.method, call.path, json=call.body)


async def refused_alike(world: World, attempts: Attempts) -> None:
    """Make every attempt as bob (on the other worker); each is refused as expected, and as the
    same request naming ids that never existed is."""
    theirs = attempts(world.alice, world.bob)
    never = attempts(world.twin, world.bob)
    headers = {**auth("bob"), **A2A_VERSION}
    async with world.layout.other.client(headers=headers) as client:
        for call, twin_call in zip(theirs, never, strict=True):
            response = await attempt(client, call)
            try:
                call.expect(response)
            except AssertionError as exc:
                raise AssertionError(f"{call.cell}: {exc}") from exc
            if not call.twin:
                continue
            twin = await attempt(client, twin_call)
            assert (response.status_code, response.headers.get("content-type")) == (
                twin.status_code,
                twin.headers.get("content-type"),
            ), call.cell
            assert normalized(response.text, world.alice) == normalized(twin.text, world.twin), (
                call.cell,
                response.text,
                twin.text,
            )


# --- the protocols' refusals ---------------------------------------------------------------------


def openai_error(status: int, code: str, kind: str) -> Check:
    """The OpenAI error shape: ``{"error": {"message", "type", "code", "param"}}``."""

    def check(response: httpx.Response) -> None:
        assert response.status_code == status, (response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error.keys() == {"message", "type", "code", "param"}, error
        assert (error["code"], error["type"]) == (code, kind), error
        assert isinstance(error["message"], str) and error["message"]

    return check


OPENAI_NOT_FOUND = openai_error(404, "not_found", "not_found_error")
OPENAI_NOT_ACCEPTED = openai_error(409, "not_accepted", "conflict_error")


def problem(status: int, code: str) -> Check:
    def check(response: httpx.Response) -> None:
        assert_problem(response, status, code)

    return check


NOT_FOUND = problem(404, "not_found")


def no_content(response: httpx.Response) -> None:
    assert response.status_code == 204, (response.status_code, response.text)
    assert response.content == b""


def a2a_rpc_not_found(response: httpx.Response) -> None:
    """JSON-RPC's ``TaskNotFoundError`` (-32001): an HTTP 200 carrying the error."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert body.keys() == {"jsonrpc", "id", "error"}, body
    assert (body["jsonrpc"], body["id"]) == ("2.0", 1)
    error = body["error"]
    assert error["code"] == -32001, error
    assert [detail["reason"] for detail in error["data"]] == ["TASK_NOT_FOUND"], error


def a2a_rest_not_found(response: httpx.Response) -> None:
    """HTTP+JSON's 404 ``google.rpc.Status`` naming ``TASK_NOT_FOUND``."""
    assert response.status_code == 404, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (404, "NOT_FOUND"), error
    assert [detail["reason"] for detail in error["details"]] == ["TASK_NOT_FOUND"], error


def a2a_rpc_no_tasks(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["tasks"] == [] and result["totalSize"] == 0, result


def a2a_rest_no_tasks(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    listed = response.json()
    assert listed["tasks"] == [] and listed["totalSize"] == 0, listed


def agui_run_error(code: str) -> Check:
    """AG-UI's refusal of a thread's state: a stream of exactly one ``RUN_ERROR``."""

    def check(response: httpx.Response) -> None:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = [line for line in response.text.split("\n\n") if line.strip()]
        assert len(frames) == 1 and frames[0].startswith("data: "), frames
        event = json.loads(frames[0].removeprefix("data: "))
        assert event.keys() == {"type", "message", "code"}, event
        assert (event["type"], event["code"]) == ("RUN_ERROR", code), event

    return check


# --- OpenAI --------------------------------------------------------------------------------------


def approval(call_id: str, approve: bool = True) -> list[dict[str, Any]]:
    """An ``mcp_approval_response`` input answering the request of ``call_id``."""
    request = f"mcpr_{call_id}"
    return [{"type": "mcp_approval_response", "approval_request_id": request, "approve": approve}]


def responses_attempts(alice: Owned, bob: Owned) -> list[Attempt]:
    base = "/openai/v1/responses"
    missing = OPENAI_NOT_FOUND

    def get(cell: str, path: str) -> Attempt:
        return Attempt(cell, "GET", f"{base}/{path}", None, missing)

    def create(cell: str, expect: Check = missing, twin: bool = True, **body: Any) -> Attempt:
        return Attempt(cell, "POST", base, {"model": AGENT, **body}, expect, twin)

    mine = "mine now"
    return [
        get("GET completed response", alice.done_response),
        get("GET waiting response", alice.wait_response),
        get("GET the response after the question", f"{alice.wait_response}_{alice.seq}"),
        get("GET ?stream=true replay", f"{alice.done_response}?stream=true"),
        get(
            "GET ?stream=true&starting_after=0",
            f"{alice.wait_response}?stream=true&starting_after=0",
        ),
        Attempt(
            "cancel waiting response", "POST", f"{base}/{alice.wait_response}/cancel", None, missing
        ),
        Attempt(
            "cancel completed response",
            "POST",
            f"{base}/{alice.done_response}/cancel",
            None,
            missing,
        ),
        create(
            "previous_response_id: completed", input=mine, previous_response_id=alice.done_response
        ),
        create(
            "previous_response_id: waiting, background",
            input=mine,
            previous_response_id=alice.wait_response,
            background=True,
        ),
        create(
            "previous_response_id, streamed",
            input=mine,
            previous_response_id=alice.done_response,
            stream=True,
        ),
        # an unknown conversation would be bob's own new one: the owner's is not found
        create(
            "conversation: completed session",
            twin=False,
            input=mine,
            conversation=alice.done_session,
        ),
        create(
            "conversation {id}: waiting session",
            twin=False,
            input=mine,
            conversation={"id": alice.wait_session},
        ),
        create(
            "mcp_approval_response: alice's response and request",
            input=approval(alice.call_id),
            previous_response_id=alice.wait_response,
        ),
        create(
            "mcp_approval_response (deny, streamed): alice's response and request",
            input=approval(alice.call_id, approve=False),
            previous_response_id=alice.wait_response,
            stream=True,
        ),
        create(
            "mcp_approval_response: bob's waiting response, alice's request",
            OPENAI_NOT_ACCEPTED,
            input=approval(alice.call_id),
            previous_response_id=bob.wait_response,
        ),
        create(
            "mcp_approval_response: bob's completed response, alice's request",
            OPENAI_NOT_ACCEPTED,
            input=approval(alice.call_id),
            previous_response_id=bob.done_response,
        ),
    ]


async def test_openai_responses(world: World) -> None:
    await refused_alike(world, responses_attempts)
    await bob_still_waits(world)
    await alice_keeps_everything(world)


async def test_openai_chat_completions(world: World) -> None:
    """A chat completion names no stored object (each runs in a session of its own): ids of
    alice's in its metadata are inert, and it lands in a session of bob's."""
    alice = world.alice
    metadata = {
        "conversation": alice.wait_session,
        "previous_response_id": alice.wait_response,
        "session_id": alice.done_session,
    }
    body = {"model": AGENT, "messages": [{"role": "user", "content": "hi"}], "metadata": metadata}
    async with world.layout.other.client(headers=auth("bob")) as client:
        answer = await client.post("/openai/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "You said: hi"
        run = (await client.get(f"/v1/runs/{answer.headers['x-run-id']}")).json()
    assert run["session_id"] not in (alice.done_session, alice.wait_session)
    assert run["status"] == "completed"
    await alice_keeps_everything(world)


# --- A2A -----------------------------------------------------------------------------------------


def a2a_message(
    *, task_id: str = "", context_id: str = "", text: str = "", approved: bool | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": "m-1", "role": "ROLE_USER", "parts": []}
    if task_id:
        message["taskId"] = task_id
    if context_id:
        message["contextId"] = context_id
    if text:
        message["parts"].append({"text": text})
    if approved is not None:
        message["parts"].append({"data": {"approved": approved}})
    return message


def rpc(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": dict(params)}


def a2a_jsonrpc_attempts(alice: Owned, bob: Owned) -> list[Attempt]:
    path = f"/a2a/{AGENT}"

    def call(cell: str, method: str, twin: bool = True, **params: Any) -> Attempt:
        return Attempt(cell, "POST", path, rpc(method, params), a2a_rpc_not_found, twin)

    answer = a2a_message(task_id=alice.wait_run, approved=True)
    return [
        call("GetTask completed task", "GetTask", id=alice.done_run),
        call("GetTask waiting task", "GetTask", id=alice.wait_run, historyLength=10),
        call("CancelTask waiting task", "CancelTask", id=alice.wait_run),
        call("CancelTask completed task", "CancelTask", id=alice.done_run),
        call("SubscribeToTask waiting task", "SubscribeToTask", id=alice.wait_run),
        call("SendMessage answering alice's input-required task", "SendMessage", message=answer),
        call(
            "SendMessage (returnImmediately) answering alice's task",
            "SendMessage",
            message=answer,
            configuration={"returnImmediately": True},
        ),
        call("SendStreamingMessage answering alice's task", "SendStreamingMessage", message=answer),
        call(
            "SendMessage: alice's taskId under bob's contextId",
            "SendMessage",
            message=a2a_message(task_id=alice.wait_run, context_id=bob.wait_session, approved=True),
        ),
        call(
            "SendMessage: alice's completed taskId and contextId, with text",
            "SendMessage",
            message=a2a_message(task_id=alice.done_run, context_id=alice.done_session, text="more"),
        ),
        # an unknown contextId would be bob's own new context: the owner's is not found
        call(
            "SendMessage continuing alice's contextId",
            "SendMessage",
            twin=False,
            message=a2a_message(context_id=alice.done_session, text="mine now"),
        ),
        call(
            "SendStreamingMessage in alice's waiting contextId",
            "SendStreamingMessage",
            twin=False,
            message=a2a_message(context_id=alice.wait_session, text="delete secret.txt"),
        ),
        Attempt(
            "ListTasks of alice's contextId",
            "POST",
            path,
            rpc("ListTasks", {"contextId": alice.wait_session}),
            a2a_rpc_no_tasks,
        ),
    ]


def a2a_rest_attempts(alice: Owned, bob: Owned) -> list[Attempt]:
    base = f"/a2a/{AGENT}"
    missing = a2a_rest_not_found

    def send(cell: str, path: str, twin: bool = True, **message: Any) -> Attempt:
        return Attempt(
            cell, "POST", f"{base}/{path}", {"message": a2a_message(**message)}, missing, twin
        )

    task = f"{base}/tasks/{alice.wait_run}"
    return [
        Attempt("GET tasks/{id} completed", "GET", f"{base}/tasks/{alice.done_run}", None, missing),
        Attempt("GET tasks/{id} waiting", "GET", task, None, missing),
        Attempt("POST tasks/{id}:cancel", "POST", f"{task}:cancel", None, missing),
        Attempt("GET tasks/{id}:subscribe", "GET", f"{task}:subscribe", None, missing),
        Attempt("POST tasks/{id}:subscribe", "POST", f"{task}:subscribe", None, missing),
        send(
            "message:send answering alice's task",
            "message:send",
            task_id=alice.wait_run,
            approved=True,
        ),
        send(
            "message:stream answering alice's task",
            "message:stream",
            task_id=alice.wait_run,
            approved=True,
        ),
        send(
            "message:send: alice's taskId under bob's contextId",
            "message:send",
            task_id=alice.wait_run,
            context_id=bob.wait_session,
            approved=False,
        ),
        # an unknown contextId would be bob's own new context: the owner's is not found
        send(
            "message:send continuing alice's contextId",
            "message:send",
            twin=False,
            context_id=alice.done_session,
            text="mine now",
        ),
        Attempt(
            "GET tasks?contextId= alice's",
            "GET",
            f"{base}/tasks?contextId={alice.done_session}",
            None,
            a2a_rest_no_tasks,
        ),
    ]


async def bob_lists_none_of_alices_tasks(world: World) -> None:
    async with world.layout.other.client(headers={**auth("bob"), **A2A_VERSION}) as client:
        listed = await client.post(f"/a2a/{AGENT}", json=rpc("ListTasks", {"pageSize": 100}))
        rest = await client.get(f"/a2a/{AGENT}/tasks", params={"pageSize": 100})
    ids = {task["id"] for task in listed.json()["result"]["tasks"]}
    assert ids == {task["id"] for task in rest.json()["tasks"]}
    assert {world.bob.done_run, world.bob.wait_run} <= ids
    assert not ids & {world.alice.done_run, world.alice.wait_run}


async def test_a2a_jsonrpc(world: World) -> None:
    await refused_alike(world, a2a_jsonrpc_attempts)
    await bob_lists_none_of_alices_tasks(world)
    await bob_still_waits(world)
    await alice_keeps_everything(world)


async def test_a2a_http_json(world: World) -> None:
    await refused_alike(world, a2a_rest_attempts)
    await bob_still_waits(world)
    await alice_keeps_everything(world)


# --- AG-UI ---------------------------------------------------------------------------------------


def resume(call_id: str, status: str = "resolved", approved: bool = True) -> list[dict[str, Any]]:
    return [{"interruptId": call_id, "status": status, "payload": {"approved": approved}}]


def agui_attempts(alice: Owned, bob: Owned) -> list[Attempt]:
    path = f"/v1/agents/{AGENT}/ag-ui"

    def run(cell: str, thread: str, expect: Check, twin: bool = True, **extra: Any) -> Attempt:
        body = {
            "threadId": thread,
            "runId": "agui-run-1",  # the client's own id for its AG-UI run
            "messages": [{"id": "u1", "role": "user", "content": "mine now"}],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
            **extra,
        }
        return Attempt(cell, "POST", path, body, expect, twin)

    missing = agui_run_error("not_found")
    call = alice.call_id
    return [
        run(
            "resume alice's interrupt on her thread",
            alice.wait_session,
            missing,
            resume=resume(call),
        ),
        run(
            "resume (cancelled) alice's interrupt on her thread",
            alice.wait_session,
            missing,
            resume=resume(call, status="cancelled"),
        ),
        run(
            "resume alice's interrupt on her completed thread",
            alice.done_session,
            missing,
            resume=resume(call),
        ),
        run(
            "resume alice's interrupt on bob's waiting thread",
            bob.wait_session,
            missing,
            resume=resume(call),
        ),
        run(
            "resume alice's interrupt on bob's completed thread",
            bob.done_session,
            missing,
            resume=resume(call),
        ),
        # an unknown thread would be bob's own new one: the owner's is not found (and her
        # pending interrupt is not told: not interrupt_pending)
        run("new input on alice's waiting thread", alice.wait_session, NOT_FOUND, twin=False),
        run("new input on alice's completed thread", alice.done_session, NOT_FOUND, twin=False),
    ]


async def test_agui(world: World) -> None:
    await refused_alike(world, agui_attempts)
    await bob_still_waits(world)
    await alice_keeps_everything(world)


# --- the AI SDK chat stream ----------------------------------------------------------------------


def user_message(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def approval_message(call_id: str, approved: bool = True) -> dict[str, Any]:
    part = {
        "type": "dynamic-tool",
        "toolName": "delete_file",
        "toolCallId": call_id,
        "state": "approval-responded",
        "input": {"path": "secret.txt"},
        "approval": {"id": call_id, "approved": approved},
    }
    return {"id": "a1", "role": "assistant", "parts": [part]}


def ai_sdk_attempts(alice: Owned, bob: Owned) -> list[Attempt]:
    base = f"/v1/agents/{AGENT}/ai-sdk/chat"

    def chat(
        cell: str, chat_id: str, message: dict[str, Any], twin: bool = True, **extra: Any
    ) -> Attempt:
        return Attempt(
            cell, "POST", base, {"id": chat_id, "messages": [message], **extra}, NOT_FOUND, twin
        )

    call = alice.call_id
    return [
        chat("approve alice's call in her chat", alice.wait_session, approval_message(call)),
        chat("deny alice's call in her chat", alice.wait_session, approval_message(call, False)),
        chat(
            "approve alice's call in bob's waiting chat", bob.wait_session, approval_message(call)
        ),
        chat(
            "approve alice's call in bob's completed chat", bob.done_session, approval_message(call)
        ),
        Attempt(
            "resume alice's waiting chat's stream",
            "GET",
            f"{base}/{alice.wait_session}/stream",
            None,
            no_content,
        ),
        Attempt(
            "resume alice's completed chat's stream",
            "GET",
            f"{base}/{alice.done_session}/stream",
            None,
            no_content,
        ),
        Attempt(
            "stop alice's waiting chat",
            "POST",
            f"{base}/{alice.wait_session}/stop",
            None,
            no_content,
        ),
        Attempt(
            "stop alice's completed chat",
            "POST",
            f"{base}/{alice.done_session}/stop",
            None,
            no_content,
        ),
        # an unknown chat would be bob's own new one: the owner's is not found (and her
        # pending approval is not told: not approval_pending)
        chat(
            "new message in alice's waiting chat",
            alice.wait_session,
            user_message("mine"),
            twin=False,
        ),
        chat(
            "new message in alice's completed chat",
            alice.done_session,
            user_message("mine"),
            twin=False,
        ),
        chat(
            "regenerate alice's last answer",
            alice.done_session,
            user_message("hello"),
            twin=False,
            trigger="regenerate-message",
            messageId=alice.done_run,
        ),
    ]


async def test_ai_sdk(world: World) -> None:
    await refused_alike(world, ai_sdk_attempts)
    await bob_still_waits(world)
    await alice_keeps_everything(world)


# --- MCP -----------------------------------------------------------------------------------------


@asynccontextmanager
async def mcp_client(server: Server, principal: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {KEYS[principal]}"}, timeout=ATTEMPT_TIMEOUT
    )
    transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
    async with http, Client(transport) as client:
        yield client


@dataclass(frozen=True)
class ToolCall:
    """One call of the agent's MCP tool (``state``: a retry's ``requestState``)."""

    cell: str
    arguments: dict[str, Any]
    code: str
    state: dict[str, Any] | None = None
    twin: bool = True


def request_state(run_id: str, session_id: str, call_id: str, seq: int) -> dict[str, Any]:
    """The retry state the server hands a host with an elicitation (its own format)."""
    return {"run_id": run_id, "session_id": session_id, "call": call_id, "seq": seq}


def mcp_attempts(alice: Owned, bob: Owned) -> list[ToolCall]:
    retry = {"input": "answer"}
    waiting = alice.wait_session
    return [
        ToolCall(
            "approve=true in alice's waiting session",
            {"session_id": waiting, "approve": True},
            "not_accepted",
        ),
        ToolCall(
            "approve=false in alice's waiting session",
            {"session_id": waiting, "approve": False},
            "not_accepted",
        ),
        ToolCall(
            "elicitation retry naming alice's run, session and call",
            retry,
            "not_found",
            request_state(alice.wait_run, waiting, alice.call_id, alice.seq),
        ),
        ToolCall(
            "elicitation retry: alice's run and call under bob's session",
            retry,
            "not_found",
            request_state(alice.wait_run, bob.wait_session, alice.call_id, alice.seq),
        ),
        ToolCall(
            "elicitation retry: bob's waiting run and session, alice's call",
            retry,
            "not_accepted",
            request_state(bob.wait_run, bob.wait_session, alice.call_id, bob.seq),
        ),
        # an unknown session would be bob's own new one: the owner's is not found
        ToolCall(
            "input continuing alice's completed session",
            {"input": "mine now", "session_id": alice.done_session},
            "not_found",
            twin=False,
        ),
        ToolCall(
            "input in alice's waiting session",
            {"input": "mine now", "session_id": waiting},
            "not_found",
            twin=False,
        ),
    ]


async def tool_error(client: Client, call: ToolCall) -> MCPError:
    """The error the agent's tool answers ``call`` with (it must not answer otherwise)."""
    kwargs: dict[str, Any] = {}
    if call.state is not None:
        kwargs = {
            "request_state": json.dumps(call.state),
            "input_responses": {
                "confirm": mcp_types.ElicitResult(action="accept", content={"approved": True})
            },
        }
    try:
        async with asyncio.timeout(ATTEMPT_TIMEOUT):
            result = await client.call_tool(AGENT, call.arguments, **kwargs)
    except MCPError as exc:
        return exc
    raise AssertionError(f"{call.cell}: answered {result!r}")


async def test_mcp(world: World) -> None:
    theirs = mcp_attempts(world.alice, world.bob)
    never = mcp_attempts(world.twin, world.bob)
    async with mcp_client(world.layout.other, "bob") as client:
        for call, twin_call in zip(theirs, never, strict=True):
            error = (await tool_error(client, call)).error
            # the tool's refusal of a bad argument: invalid params, with the service's code
            assert (error.code, error.data) == (-32602, {"code": call.code}), (call.cell, error)
            assert error.message, call.cell
            if not call.twin:
                continue
            twin = (await tool_error(client, twin_call)).error
            assert (twin.code, twin.data) == (error.code, error.data), call.cell
            assert normalized(error.message, world.alice) == normalized(twin.message, world.twin), (
                call.cell
            )
    await bob_still_waits(world)
    await alice_keeps_everything(world)


# --- the matrix as a whole -----------------------------------------------------------------------


CELLS: Sequence[tuple[str, Attempts]] = (
    ("OpenAI Responses", responses_attempts),
    ("A2A JSON-RPC", a2a_jsonrpc_attempts),
    ("A2A HTTP+JSON", a2a_rest_attempts),
    ("AG-UI", agui_attempts),
    ("AI SDK", ai_sdk_attempts),
)


def test_every_attempt_names_alices_objects() -> None:
    """Each attempt of the matrix puts one of alice's ids in the request (a cell that named
    none would prove nothing)."""
    alice, bob = nobody(), nobody()
    ids = [alice.done_session, alice.wait_session, alice.call_id]
    ids += [alice.done_run.removeprefix("run_"), alice.wait_run.removeprefix("run_")]
    for protocol, attempts in CELLS:
        for call in attempts(alice, bob):
            request = call.path + json.dumps(call.body)
            assert any(value in request for value in ids), (protocol, call.cell)
    for tool_call in mcp_attempts(alice, bob):
        request = json.dumps([tool_call.arguments, tool_call.state])
        assert any(value in request for value in ids), ("MCP", tool_call.cell)
