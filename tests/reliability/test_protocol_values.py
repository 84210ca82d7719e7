"""Client text and ids on the protocol paths get what the native run start gives them.

A lone surrogate, a NUL (PostgreSQL cannot store one; SQLite can, and is held to the same rule)
or a body that is not UTF-8, sent to each protocol path that starts a run, is refused in that
protocol's own error shape, on SQLite and on PostgreSQL alike: no 500, no database's error text,
nothing stored, and the server goes on serving. A session id a protocol takes from its client
(Responses ``conversation``, MCP ``session_id``, A2A ``contextId``) keeps the session-id rule,
so that every session it names can be read and deleted through the native routes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.problems import assert_problem
from tests.support.server import BACKENDS, Server, backend_env, launch, stop

pytestmark = pytest.mark.postgres

JSON = {"content-type": "application/json"}
A2A = {**JSON, "A2A-Version": "1.0"}
MCP = {**JSON, "accept": "application/json, text/event-stream"}

# what a database or a driver says of a value it cannot take: never part of an answer
LEAKS = ("invalid byte sequence", "UTF8", "0x00", "asyncpg", "sqlite", "Traceback", "codec")


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    failed = request.session.testsfailed
    with backend_env(request.param) as env:
        running = launch(tmp_path_factory.mktemp("protocol-values"), env)
        yield running
        stop(running, request, failed)


# --- the protocol paths, each as a body template: the input text and the session id ---------


@dataclass(frozen=True)
class Path:
    """A protocol path that starts a run; ``body(text, sid)`` with ``text`` a JSON literal."""

    name: str
    url: str
    headers: dict[str, str]
    body: Callable[[str, str], str]
    # the protocol's name of the field the input text is in (the OpenAI error's ``param``)
    field: str
    # False: the request names no session (it gets one of its own)
    names_session: bool = True


PATHS = [
    Path(
        "responses",
        "/openai/v1/responses",
        JSON,
        lambda text, sid: f'{{"model":"default","input":{text},"conversation":"{sid}"}}',
        "input",
    ),
    Path(
        "chat",
        "/openai/v1/chat/completions",
        JSON,
        lambda text, _: f'{{"model":"default","messages":[{{"role":"user","content":{text}}}]}}',
        "messages",
        names_session=False,
    ),
    Path(
        "ag-ui",
        "/v1/agents/default/ag-ui",
        JSON,
        lambda text, sid: (
            f'{{"threadId":"{sid}","runId":"r1",'
            f'"messages":[{{"id":"m1","role":"user","content":{text}}}]}}'
        ),
        "messages",
    ),
    Path(
        "ai-sdk",
        "/v1/agents/default/ai-sdk/chat",
        JSON,
        lambda text, sid: (
            f'{{"id":"{sid}","messages":[{{"id":"m1","role":"user",'
            f'"parts":[{{"type":"text","text":{text}}}]}}]}}'
        ),
        "messages",
    ),
    Path(
        "a2a-rest",
        "/a2a/default/message:send",
        A2A,
        lambda text, sid: (
            f'{{"message":{{"messageId":"m1","role":"ROLE_USER","contextId":"{sid}",'
            f'"parts":[{{"text":{text}}}]}}}}'
        ),
        "message.parts",
    ),
    Path(
        "a2a-jsonrpc",
        "/a2a/default",
        A2A,
        lambda text, sid: (
            '{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":'
            f'{{"messageId":"m1","role":"ROLE_USER","contextId":"{sid}",'
            f'"parts":[{{"text":{text}}}]}}}}}}'
        ),
        "message.parts",
    ),
    Path(
        "mcp",
        "/mcp",
        MCP,
        lambda text, sid: (
            '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"default",'
            f'"arguments":{{"input":{text},"session_id":"{sid}"}}}}}}'
        ),
        "arguments.input",
    ),
]
PATH_IDS = [path.name for path in PATHS]

# the faults: a JSON literal for the input text, and how the body is encoded
FAULTS: dict[str, tuple[str, str]] = {
    "lone surrogate": ('"a\\ud800b"', "utf-8"),
    "NUL": ('"a\\u0000b"', "utf-8"),
    "not UTF-8": ('"caf\xe9"', "latin-1"),
}


def _session(path: Path, fault: str) -> str:
    return f"pv-{path.name}-{fault.replace(' ', '-').lower()}"


def _rpc(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer: its body, or the one ``data:`` line of its stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        (line,) = [x for x in response.text.splitlines() if x.startswith("data:")]
        message: dict[str, Any] = json.loads(line.removeprefix("data:"))
        return message
    body: dict[str, Any] = response.json()
    return body


def assert_refused(path: Path, fault: str, response: httpx.Response) -> None:
    """The answer is ``path``'s protocol's own refusal of ``fault``."""
    assert not any(leak in response.text for leak in LEAKS), response.text
    if path.name in ("responses", "chat"):
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error", error
        assert error["code"] == "validation_error"
        if fault == "not UTF-8":
            # unreadable JSON, as on every /openai/v1 path
            assert response.status_code == 422, response.text
            assert error["param"] is None
        else:
            assert response.status_code == 400, response.text
            assert error["param"] == path.field
            assert error["message"].startswith(path.field)
    elif path.name in ("ag-ui", "ai-sdk"):
        problem = assert_problem(response, 422, "validation_error")
        if fault != "not UTF-8":
            assert f"body.{path.field}" in problem["detail"]
    elif path.name == "a2a-rest":
        assert response.status_code == 400, response.text
        assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    elif path.name == "a2a-jsonrpc":
        assert response.status_code == 200, response.text
        error = response.json()["error"]
        assert error["code"] == (-32700 if fault == "not UTF-8" else -32602), error
    else:  # mcp: the SDK's parser refuses what JSON cannot hold; the tool, NUL
        error = _rpc(response)["error"]
        if fault == "NUL":
            assert response.status_code == 200, response.text
            assert error["code"] == -32602
            assert error["data"] == {"code": "validation_error"}
            assert error["message"].startswith(path.field)
        else:
            assert response.status_code == 400, response.text
            assert error["code"] == -32700


async def _session_ids(client: httpx.AsyncClient) -> set[str]:
    listed = await client.get("/v1/sessions", params={"limit": 100})
    assert listed.status_code == 200, listed.text
    return {session["session_id"] for session in listed.json()["sessions"]}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
async def test_unstorable_text_is_refused_in_the_protocols_shape(
    server: Server, path: Path, fault: str
) -> None:
    text, encoding = FAULTS[fault]
    session = _session(path, fault)
    async with server.client() as client:
        before = await _session_ids(client)
        body = path.body(text, session).encode(encoding)
        response = await client.post(path.url, content=body, headers=path.headers)
        assert_refused(path, fault, response)
        # nothing was started or stored, and the server serves on
        assert await _session_ids(client) == before
        if path.names_session:
            assert (await client.get(f"/v1/sessions/{session}")).status_code == 404
        assert (await client.get("/healthz")).status_code == 200
    # no error went unmapped (the catch-all's, A2A's and MCP's own log lines for one); the
    # A2A SDK logs its own parse errors with their traceback, so that word alone says nothing
    assert "unhandled error" not in server.log()


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
async def test_the_same_request_with_plain_text_runs(server: Server, path: Path) -> None:
    session = f"pv-{path.name}-plain"
    async with server.client() as client:
        before = await _session_ids(client)
        body = path.body('"a\\u0001b caf\\u00e9"', session).encode()
        response = await client.post(path.url, content=body, headers=path.headers)
        assert response.status_code == 200, response.text
        assert "error" not in _rpc(response) if path.name == "mcp" else True
        after = await _session_ids(client)
        if path.names_session:
            assert after - before == {session}
            stored = session
        else:
            # a chat completion's session of its own is stateless: stored, never listed
            assert after == before
            run = await client.get(f"/v1/runs/{response.headers['x-run-id']}")
            stored = run.json()["session_id"]
            assert (await client.get(f"/v1/sessions/{stored}")).json()["stateless"] is True
        messages = await client.get(f"/v1/sessions/{stored}/messages")
        assert messages.json()["messages"][0]["content"] == "a\u0001b caf\u00e9"


# --- the other fields a client sends: each checked, each named ------------------------------

# (path, label, body, the field named in the answer)
OTHER_FIELDS = [
    (
        "responses",
        "NUL in a metadata value",
        '{"model":"default","input":"hi","metadata":{"k":"v\\u0000"}}',
        "metadata",
    ),
    (
        "responses",
        "NUL in instructions",
        '{"model":"default","input":"hi","instructions":"be \\u0000 brief"}',
        "instructions",
    ),
    (
        "responses",
        "NUL in an approval id",
        '{"model":"default","previous_response_id":"resp_0",'
        '"input":[{"type":"mcp_approval_response","approval_request_id":"a\\u0000",'
        '"approve":true}]}',
        "input",
    ),
    (
        "chat",
        "a lone surrogate in a metadata key",
        '{"model":"default","messages":[{"role":"user","content":"hi"}],'
        '"metadata":{"\\udc00":"v"}}',
        "metadata",
    ),
    (
        "ag-ui",
        "NUL in a tool result sent back",
        '{"threadId":"pv-agui-tool","runId":"r1","messages":['
        '{"id":"t1","role":"tool","toolCallId":"c1","content":"\\u0000"},'
        '{"id":"m1","role":"user","content":"hi"}]}',
        "messages",
    ),
    (
        "ag-ui",
        "NUL in the client's run id",
        '{"threadId":"pv-agui-run","runId":"r\\u0000","messages":'
        '[{"id":"m1","role":"user","content":"hi"}]}',
        "runId",
    ),
    (
        "ai-sdk",
        "a lone surrogate in an earlier message",
        '{"id":"pv-aisdk-history","messages":['
        '{"id":"a0","role":"assistant","parts":[{"type":"text","text":"\\ud800"}]},'
        '{"id":"m1","role":"user","parts":[{"type":"text","text":"hi"}]}]}',
        "messages",
    ),
    (
        "a2a-rest",
        "NUL in the context id",
        '{"message":{"messageId":"m1","role":"ROLE_USER","contextId":"c\\u0000",'
        '"parts":[{"text":"hi"}]}}',
        "contextId",
    ),
    (
        "a2a-jsonrpc",
        "NUL in a task id",
        '{"jsonrpc":"2.0","id":7,"method":"GetTask","params":{"id":"run_\\u0000"}}',
        "",
    ),
    (
        "a2a-jsonrpc",
        "NUL in the listed context",
        '{"jsonrpc":"2.0","id":7,"method":"ListTasks","params":{"contextId":"c\\u0000"}}',
        "contextId",
    ),
    (
        "mcp",
        "NUL in the session id",
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"default",'
        '"arguments":{"input":"hi","session_id":"s\\u0000"}}}',
        "arguments",
    ),
]


@pytest.mark.parametrize(
    ("name", "label", "body", "field"), OTHER_FIELDS, ids=[f[1] for f in OTHER_FIELDS]
)
async def test_every_field_a_client_sends_is_held_to_the_rule(
    server: Server, name: str, label: str, body: str, field: str
) -> None:
    path = next(p for p in PATHS if p.name == name)
    async with server.client() as client:
        before = await _session_ids(client)
        response = await client.post(path.url, content=body.encode(), headers=path.headers)
        assert not any(leak in response.text for leak in LEAKS), response.text
        if name in ("responses", "chat"):
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == field
        elif name in ("ag-ui", "ai-sdk"):
            problem = assert_problem(response, 422, "validation_error")
            assert f"body.{field}" in problem["detail"]
        elif name == "a2a-rest":
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"].startswith(field)
        elif name == "a2a-jsonrpc":
            error = response.json()["error"]
            if field:  # a refused value; a task id that cannot be one is no task
                assert error["code"] == -32602, error
                assert error["message"].startswith(field)
            else:
                assert error["code"] == -32001, error  # TaskNotFoundError
        else:
            error = _rpc(response)["error"]
            assert (error["code"], error["data"]) == (-32602, {"code": "validation_error"})
        assert await _session_ids(client) == before
        assert (await client.get("/healthz")).status_code == 200


# --- session ids a protocol takes from its client ----------------------------------------------

BAD_IDS = {
    "a slash": "a/b",
    "a newline": "a\nb",
    "a trailing newline": "ab\n",
    "a space": "a b",
    "20000 characters": "x" * 20_000,
    "not ASCII": "caf\u00e9",
}


def _mcp_call(arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "default", "arguments": arguments},
    }


@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
async def test_ids_breaking_the_session_id_rule_are_refused(server: Server, bad: str) -> None:
    async with server.client() as client:
        before = await _session_ids(client)
        for conversation in (bad, {"id": bad}):
            body = {"model": "default", "input": "hi", "conversation": conversation}
            response = await client.post("/openai/v1/responses", json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", "conversation")
        mcp = await client.post(
            "/mcp", json=_mcp_call({"input": "hi", "session_id": bad}), headers=MCP
        )
        error = _rpc(mcp)["error"]
        assert (error["code"], error["data"]) == (-32602, {"code": "validation_error"})
        assert error["message"].startswith("session_id")
        message = {
            "messageId": "m1",
            "role": "ROLE_USER",
            "contextId": bad,
            "parts": [{"text": "hi"}],
        }
        a2a = await client.post("/a2a/default/message:send", json={"message": message}, headers=A2A)
        assert a2a.status_code == 400, a2a.text
        assert a2a.json()["error"]["message"].startswith("contextId")
        assert await _session_ids(client) == before


async def test_valid_ids_still_name_sessions_the_native_routes_reach(server: Server) -> None:
    async with server.client() as client:
        conversation = "pv.conv:1_-"
        body = {"model": "default", "input": "hi", "conversation": {"id": conversation}}
        response = await client.post("/openai/v1/responses", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["conversation"]["id"] == conversation
        session = "pv.mcp:1_-"
        mcp = await client.post(
            "/mcp", json=_mcp_call({"input": "hi", "session_id": session}), headers=MCP
        )
        result = _rpc(mcp)["result"]
        assert result["structuredContent"]["session_id"] == session
        # an empty session_id is a form field left blank: a new session
        fresh = await client.post(
            "/mcp", json=_mcp_call({"input": "hi", "session_id": ""}), headers=MCP
        )
        assert _rpc(fresh)["result"]["structuredContent"]["session_id"].startswith("mcp_")
        for name in (conversation, session):
            assert (await client.get(f"/v1/sessions/{name}")).status_code == 200
            assert (await client.delete(f"/v1/sessions/{name}")).status_code == 204
