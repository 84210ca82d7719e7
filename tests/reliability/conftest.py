"""The reliability suite's fixtures: real ``agent-server`` processes, a fake model upstream on
loopback, and probes of what a server holds.

Every server is a real process started with ``tests.e2e.conftest.launch`` (its own temporary
directory, SQLite file and free port; stdout and stderr captured in one log file). Servers that
talk to a model use ``AGENT_MODEL=openai:fake-model`` (or ``anthropic:fake-model``) against
``FakeUpstream`` running on a thread of the test process, which speaks both wires, with the
provider's API key set to a canary key that must never show up anywhere but in the upstream's
own request headers.

Probes: ``state()`` reads ``GET /debug/state`` (``?gc=true`` collects garbage first and counts
pending futures), ``rss()`` the server's resident memory (psutil), ``upstream_sockets()`` its
TCP connections to the fake upstream.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any, Literal, TypeAlias

import httpx
import psutil
import pytest

from tests.e2e.conftest import (
    TERMINAL,
    Event,
    Server,
    assert_well_formed,
    open_stream,
    read_events,
    wait_for,
)
from tests.fakes.upstream import (
    Behaviour,
    Endless,
    FakeToolCall,
    FakeUpstream,
    RecordedRequest,
    Respond,
    Text,
    ToolCalls,
)

__all__ = [
    "CANARY",
    "KEYS",
    "LEAK_KEYS",
    "PROBLEM",
    "PROVIDERS",
    "TERMINAL",
    "Event",
    "Provider",
    "Server",
    "assert_problem",
    "assert_well_formed",
    "auth",
    "demo_like",
    "open_stream",
    "read_events",
    "rss",
    "state",
    "stop",
    "upstream_env",
    "upstream_sockets",
    "wait_for",
]

PROBLEM = "application/problem+json"

Provider: TypeAlias = Literal["openai", "anthropic"]
# the wires a server's model can speak to the fake upstream
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic")

# a recognisable key without the "sk-" shape, so that only exact-secret redaction can hide it
CANARY = f"canary-{secrets.token_hex(20)}"

KEYS = {"alice": f"key-alice-{secrets.token_hex(8)}", "bob": f"key-bob-{secrets.token_hex(8)}"}
API_KEYS = ",".join(f"{key}={principal}" for principal, key in KEYS.items())

# counts of /debug/state that are zero on an idle server
LEAK_KEYS = (
    "runs",
    "tasks",
    "sse_streams",
    "blocking_waiters",
    "admission_running",
    "admission_queued",
    "admission_principals",
    "agent_active_runs",
    "agent_active_sessions",
    "subscribers",
    "locks",
    "routed_runs",
    "live_event_logs",
    "unwritten_ends",
)


def auth(principal: str) -> dict[str, str]:
    """The ``Authorization`` header of ``principal`` (a key of ``KEYS``)."""
    return {"Authorization": f"Bearer {KEYS[principal]}"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem with this status and code; its body."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert isinstance(body["detail"], str) and body["detail"]
    assert {"type", "title"} <= body.keys()
    return body


# --- the fake upstream ---------------------------------------------------------------------------

_DELETE = re.compile(r"\bdelete\s+(\S+)", re.IGNORECASE)


def _last_message(request: RecordedRequest) -> tuple[bool, str]:
    """Whether the request's last message is a tool's result, and its text, on either wire.

    OpenAI sends a ``tool`` message with string content; Anthropic a ``user`` turn of blocks,
    ``tool_result`` or ``text``.
    """
    messages = request.messages
    last = messages[-1] if messages else {}
    if not isinstance(last, dict):
        return False, ""
    content = last.get("content")
    if not isinstance(content, list):
        return last.get("role") == "tool", str(content or "")
    blocks = [block for block in content if isinstance(block, dict)]
    results = [block for block in blocks if block.get("type") == "tool_result"]
    if results:
        return True, str(results[-1].get("content"))
    return False, "".join(str(block.get("text", "")) for block in blocks)


def demo_like(request: RecordedRequest) -> Behaviour:
    """The demo model's behaviour over either wire: ``delete NAME`` calls ``delete_file``
    (policy ``ask``), ``endless`` streams one chunk and then only keep-alives, anything else
    is echoed. A tool's result is answered with a sentence."""
    tool_result, prompt = _last_message(request)
    if tool_result:
        return Text(f"The tool said: {prompt[:60]}")
    if "endless" in prompt:
        return Endless(text="this stream never ends", after_chunks=1, ping_interval=0.05)
    deletion = _DELETE.search(prompt)
    if deletion is not None:
        return ToolCalls([FakeToolCall("delete_file", {"path": deletion.group(1)})])
    return Text(f"You said: {prompt}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    """A fake upstream (both wires) on a thread, answering like the demo model unless
    scripted."""
    with FakeUpstream.in_thread(default=Respond(demo_like)) as running:
        yield running


def upstream_env(
    upstream: FakeUpstream, provider: Provider = "openai", **extra: str
) -> dict[str, str]:
    """The environment of a server whose model, ``PROVIDER:fake-model``, is the fake upstream
    (the provider's SDK, base URL and the canary as its key)."""
    if provider == "openai":
        wire = {"OPENAI_BASE_URL": upstream.openai_url, "OPENAI_API_KEY": CANARY}
    else:
        wire = {"ANTHROPIC_BASE_URL": upstream.anthropic_url, "ANTHROPIC_API_KEY": CANARY}
    return {
        "AGENT_MODEL": f"{provider}:fake-model",
        **wire,
        "AGENT_CLIENT_MAX_RETRIES": "0",
        "AGENT_CLIENT_TIMEOUT": "2",
        **extra,
    }


def stop(server: Server, request: pytest.FixtureRequest, failed_before: int) -> None:
    """Stop a module's server; print its log's tail if a test failed while it served."""
    server.stop()
    if request.session.testsfailed > failed_before:
        print(f"--- {server.base_url} log (tail) ---\n{server.log()[-20000:]}")


# --- probes --------------------------------------------------------------------------------------


async def state(
    client: httpx.AsyncClient, *, gc: bool = False, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """``GET /debug/state`` (``gc``: collect garbage first and count pending futures)."""
    response = await client.get(
        "/debug/state", params={"gc": "true"} if gc else None, headers=headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def idle(body: dict[str, Any]) -> bool:
    """True if nothing of a run is held any more."""
    pending = any(
        counts.get("pending") or counts.get("staged") for counts in body["extensions"].values()
    )
    return all(body[key] == 0 for key in LEAK_KEYS) and not pending


async def wait_idle(
    client: httpx.AsyncClient, *, within: float = 30.0, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Wait until the server holds nothing of any run; its state then."""

    async def check() -> dict[str, Any] | None:
        body = await state(client, headers=headers)
        return body if idle(body) else None

    result: dict[str, Any] = await wait_for(check, within=within)
    return result


def rss(server: Server) -> int:
    """The server process's resident set size, in bytes."""
    return int(psutil.Process(server.process.pid).memory_info().rss)


def upstream_sockets(server: Server, upstream: FakeUpstream) -> int:
    """The server's established TCP connections to the fake upstream."""
    connections = psutil.Process(server.process.pid).net_connections(kind="tcp")
    return sum(
        1
        for connection in connections
        if connection.raddr
        and connection.raddr.port == upstream.port
        and connection.status == psutil.CONN_ESTABLISHED
    )
