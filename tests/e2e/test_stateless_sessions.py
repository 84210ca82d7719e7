"""Stateless protocol calls over HTTP, on SQLite and on PostgreSQL with Redis: a chat
completion, a response naming no conversation (or sent with ``store: false``) and an MCP call
without ``session_id`` each keep a session of their own that ``GET /v1/sessions`` never lists
and that is deleted, with its runs, once idle for ``AGENT_STATELESS_RETENTION``. A protocol
call that names its conversation keeps a listed one, and so does a native run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.server import BACKENDS, Server, backend_env, launch

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

RETENTION = 5.0
MCP = {"accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with backend_env(request.param) as env:
        running = launch(
            tmp_path_factory.mktemp("stateless"),
            {**env, "AGENT_STATELESS_RETENTION": str(RETENTION)},
        )
        yield running
        running.stop()


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        yield http


def _wait_until(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.05)


def _listed(client: httpx.Client) -> set[str]:
    answer = client.get("/v1/sessions", params={"limit": 100})
    assert answer.status_code == 200, answer.text
    return {item["session_id"] for item in answer.json()["sessions"]}


def _session_of_run(client: httpx.Client, run_id: str) -> str:
    answer = client.get(f"/v1/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    session_id: str = answer.json()["session_id"]
    return session_id


def _chat(client: httpx.Client) -> str:
    answer = client.post(
        "/openai/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "You said: hello"
    return _session_of_run(client, answer.headers["x-run-id"])


def _respond(client: httpx.Client, **fields: Any) -> tuple[str, str]:
    """A response's session and id."""
    answer = client.post("/openai/v1/responses", json={"model": "default", "input": "hi", **fields})
    assert answer.status_code == 200, answer.text
    return _session_of_run(client, answer.headers["x-run-id"]), answer.json()["id"]


def _mcp(client: httpx.Client, **arguments: Any) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "default", "arguments": {"input": "hi", **arguments}},
    }
    answer = client.post("/mcp", json=body, headers=MCP)
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        (line,) = [x for x in answer.text.splitlines() if x.startswith("data:")]
        message: dict[str, Any] = json.loads(line.removeprefix("data:"))
    else:
        message = answer.json()
    result = message["result"]
    assert not result.get("isError"), result
    session_id: str = result["structuredContent"]["session_id"]
    return session_id


def _stateless(client: httpx.Client, session_id: str) -> bool:
    answer = client.get(f"/v1/sessions/{session_id}")
    assert answer.status_code == 200, answer.text
    flag: bool = answer.json()["stateless"]
    return flag


def _gone(client: httpx.Client, session_id: str) -> bool:
    return client.get(f"/v1/sessions/{session_id}").status_code == 404


def test_stateless_calls_are_not_listed_and_are_deleted_after_the_retention(
    client: httpx.Client, server: Server
) -> None:
    native = f"native-{time.monotonic_ns()}"
    started = client.post(f"/v1/sessions/{native}/runs", json={"input": "hi", "stream": False})
    assert started.status_code == 200, started.text
    named = f"conversation-{time.monotonic_ns()}"

    chat = _chat(client)
    chat_run = client.get(f"/v1/sessions/{chat}").json()["last_run_id"]
    response, response_id = _respond(client)
    unstored, _ = _respond(client, conversation=f"unstored-{time.monotonic_ns()}", store=False)
    kept, _ = _respond(client, conversation=named)
    mcp = _mcp(client)
    mcp_named = _mcp(client, session_id=f"mcp-named-{time.monotonic_ns()}")

    stateless = {chat, response, unstored, mcp}
    assert len(stateless) == 4
    assert all(_stateless(client, session_id) for session_id in stateless)
    assert not any(_stateless(client, session_id) for session_id in (native, kept, mcp_named))
    listed = _listed(client)
    assert {native, kept, mcp_named} <= listed
    assert not stateless & listed

    # a stateless response goes on with previous_response_id, and stays unlisted
    follow_up, _ = _respond(client, previous_response_id=response_id)
    assert follow_up == response
    assert response not in _listed(client)

    # once idle past the retention, each is deleted with its runs; the others are kept
    _wait_until(lambda: all(_gone(client, session_id) for session_id in stateless))
    assert client.get(f"/v1/runs/{chat_run}").status_code == 404
    for session_id in (native, kept, mcp_named):
        assert client.get(f"/v1/sessions/{session_id}").status_code == 200
    assert {native, kept, mcp_named} <= _listed(client)
