"""Probes of what a server holds: ``GET /debug/state``, its memory, its upstream sockets.

``state()`` reads ``GET /debug/state`` (``?gc=true`` collects garbage first and counts pending
futures), ``rss()`` the server's resident memory (psutil), ``upstream_sockets()`` its TCP
connections to the fake upstream.
"""

from __future__ import annotations

from typing import Any

import httpx
import psutil

from tests.fakes.upstream import FakeUpstream
from tests.support.server import Server
from tests.support.waiting import wait_for

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
