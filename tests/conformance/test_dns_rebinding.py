"""DNS rebinding: a page whose name was made to resolve to the server runs nothing there.

A rebound page's requests carry its own name in ``Host`` and ``Origin``
(``evil.example.com``). Every route family (native, UI, each protocol) refuses them with 403
before anything is read, each in its own protocol's error shape; no run starts, no tool runs.
``AGENT_ALLOWED_HOSTS`` names the hosts a deployment answers to (loopback names by default).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.server import Server, launch

EVIL = "evil.example.com"
KEY = "sk-rebinding"

# one request per route family: the method, path and body a page would send to run the agent
ROUTES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "native": ("POST", "/v1/sessions/rebound/runs", {"input": "what time is it", "stream": False}),
    "ui": ("GET", "/", None),
    "external-events": (
        "POST",
        "/external-events",
        {"session_id": "rebound", "name": "confirmation_response", "payload": {}},
    ),
    "openai-responses": ("POST", "/openai/v1/responses", {"model": "default", "input": "time"}),
    "openai-chat": (
        "POST",
        "/openai/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "what time is it"}]},
    ),
    "a2a-card": ("GET", "/.well-known/agent-card.json", None),
    "a2a-jsonrpc": (
        "POST",
        "/a2a/default",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": "m1",
                    "role": "ROLE_USER",
                    "parts": [{"text": "what time is it"}],
                }
            },
        },
    ),
    "mcp": (
        "POST",
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "default", "arguments": {"input": "what time is it"}},
        },
    ),
    "ag-ui": (
        "POST",
        "/v1/agents/default/ag-ui",
        {
            "threadId": "rebound-agui",
            "runId": "r1",
            "messages": [{"id": "u1", "role": "user", "content": "what time is it"}],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
        },
    ),
    "ai-sdk": (
        "POST",
        "/v1/agents/default/ai-sdk/chat",
        {
            "id": "rebound-ai",
            "trigger": "submit-message",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "time"}]}],
        },
    ),
}


def _shape(family: str, answer: httpx.Response) -> None:
    """The refusal is in the family's own error shape."""
    body = answer.json()
    if family.startswith("openai"):
        assert body["error"]["code"] == "forbidden_host"
        assert body["error"]["type"] == "permission_error"
    elif family.startswith("a2a"):
        assert body["error"]["status"] == "PERMISSION_DENIED"
    elif family == "mcp":
        assert body["jsonrpc"] == "2.0" and body["id"] is None
        assert body["error"]["code"] == -32600
    else:
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert body["code"] == "forbidden_host" and body["status"] == 403


def _headers(family: str) -> dict[str, str]:
    if family == "mcp":
        return {
            "Accept": "application/json, text/event-stream",
            "Mcp-Protocol-Version": "2025-06-18",
        }
    if family == "a2a-jsonrpc":
        return {"A2A-Version": "1.0"}
    return {}


async def _runs_seen(client: httpx.AsyncClient) -> float:
    """Runs ended plus runs executing, from /metrics (which no host guard covers)."""
    text = (await client.get("/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("agent_runs_total{", "agent_runs_in_flight ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default configuration: no keys, the default allowed hosts."""
    server = launch(tmp_path_factory.mktemp("open"), {})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(tmp_path_factory.mktemp("keyed"), {"AGENT_API_KEYS": f"{KEY}=alice"})
    yield server
    server.stop()


@pytest.mark.parametrize("family", sorted(ROUTES))
@pytest.mark.parametrize(
    "attack",
    [
        pytest.param({"Host": EVIL, "Origin": f"http://{EVIL}"}, id="rebound"),
        pytest.param({"Host": EVIL}, id="host"),
        pytest.param({"Origin": f"http://{EVIL}"}, id="cross-site-origin"),
        pytest.param({"Origin": "null"}, id="null-origin"),
    ],
)
async def test_a_rebound_request_is_refused_and_runs_nothing(
    open_server: Server, family: str, attack: dict[str, str]
) -> None:
    method, path, body = ROUTES[family]
    async with open_server.client() as client:
        before = await _runs_seen(client)
        answer = await client.request(
            method, path, json=body, headers={**_headers(family), **attack}
        )
        assert answer.status_code == 403, answer.text
        _shape(family, answer)
        assert await _runs_seen(client) == before
        # the session a native run would have made does not exist
        assert (await client.get("/v1/sessions/rebound")).status_code == 404


@pytest.mark.parametrize("family", sorted(ROUTES))
async def test_keys_do_not_lift_the_origin_check(keyed_server: Server, family: str) -> None:
    # a page of another site whose user's browser holds a key (a cookie-less API still has
    # the UI's stored key) is refused before the key is looked at
    method, path, body = ROUTES[family]
    headers = {**_headers(family), "Authorization": f"Bearer {KEY}", "Origin": f"https://{EVIL}"}
    async with keyed_server.client() as client:
        answer = await client.request(method, path, json=body, headers=headers)
    assert answer.status_code == 403, answer.text
    _shape(family, answer)


async def test_the_loopback_names_and_the_servers_own_origin_are_served(
    open_server: Server,
) -> None:
    port = open_server.port
    async with open_server.client() as client:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "localhost"):
            answer = await client.get("/v1/agents", headers={"Host": host})
            assert answer.status_code == 200, (host, answer.text)
        answer = await client.post(
            "/v1/sessions/same-origin/runs",
            json={"input": "hello", "stream": False},
            headers={"Origin": f"http://127.0.0.1:{port}"},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"]["content"] == "You said: hello"


async def test_probes_answer_whatever_host_they_name(open_server: Server) -> None:
    # orchestrators probe each worker by its address (a pod's IP): not a page's request
    async with open_server.client() as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            answer = await client.get(path, headers={"Host": "10.1.2.3:8000"})
            assert answer.status_code == 200, path


async def test_behind_a_proxy_its_host_is_listed(tmp_path_factory: pytest.TempPathFactory) -> None:
    # a reverse proxy passing Host: agents.example.com (nginx's proxy_set_header Host $host),
    # and the UI's pages on that site: both name the listed host
    server = launch(
        tmp_path_factory.mktemp("proxied"),
        {"AGENT_ALLOWED_HOSTS": "agents.example.com, *.internal.example.com"},
    )
    try:
        async with server.client() as client:
            site = {"Host": "agents.example.com", "Origin": "https://agents.example.com"}
            answer = await client.post(
                "/openai/v1/chat/completions",
                json={"model": "default", "messages": [{"role": "user", "content": "hi"}]},
                headers=site,
            )
            assert answer.status_code == 200, answer.text
            sub = await client.get("/v1/agents", headers={"Host": "a.internal.example.com"})
            assert sub.status_code == 200
            # the list replaces the default: loopback is no longer a name of this server
            direct = await client.get("/v1/agents")
            assert direct.status_code == 403
            assert direct.json()["code"] == "forbidden_host"
            other = await client.get("/v1/agents", headers={"Host": "internal.example.com"})
            assert other.status_code == 403
    finally:
        server.stop()


async def test_a_star_lets_every_host_through(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = launch(tmp_path_factory.mktemp("star"), {"AGENT_ALLOWED_HOSTS": "*"})
    try:
        async with server.client() as client:
            answer = await client.get(
                "/v1/agents", headers={"Host": EVIL, "Origin": f"http://{EVIL}"}
            )
            assert answer.status_code == 200
    finally:
        server.stop()
