"""A pooled streamable-HTTP MCP server restarted while its sessions sit idle.

The reference server, ``server-everything`` (TypeScript SDK; ``tests.fakes.mcp_everything``),
a stateful server that answers a session id it does not know with 400 "Bad Request: No valid
session ID provided" (the spec says 404: both count), holds three pooled sessions of the
client, then is replaced by a new process on the same port. Every later call must succeed: the
first finds its session unknown, the pool replaces it (and the other idle ones, opened before
the same restart) and the call runs once more on a fresh session; the pool stays within its
size and the calls after the first use that one fresh session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runtime.mcp import MCPClient, MCPServerConfig
from agent_runtime.mcp.sessions import session_unknown
from tests.fakes.mcp_everything import EverythingServer
from tests.support import npm as npm_clients

pytestmark = pytest.mark.slow


@pytest.fixture
def everything(tmp_path: Path) -> Iterator[EverythingServer]:
    server = EverythingServer(npm_clients.node(), tmp_path / "everything.log")
    try:
        yield server
    finally:
        server.close()


async def test_calls_after_a_restart_run_on_fresh_sessions(everything: EverythingServer) -> None:
    pooled = MCPClient(
        [MCPServerConfig.streamable_http("ref", everything.url, session_pool_size=3, timeout=20)]
    )
    await pooled.start()
    try:
        # three calls at once open three sessions (each call holds its session while it runs)
        results = await asyncio.gather(
            *(pooled.call_tool("ref__echo", {"message": f"m{i}"}) for i in range(3))
        )
        assert all("m" in result for result in results)
        opened_before = pooled.pool_size("ref")
        assert 1 <= opened_before <= 3

        everything.restart()  # the pool's sessions are idle, and now unknown to the server

        started = time.monotonic()
        after = [await pooled.call_tool("ref__echo", {"message": f"after{i}"}) for i in range(6)]
        took = time.monotonic() - started
        assert [f"after{i}" in text for i, text in enumerate(after)] == [True] * 6
        assert pooled.pool_size("ref") == 1  # the stale ones replaced by one fresh session
    finally:
        await pooled.close()
    print(
        f"\nserver-everything restarted under a pool of {opened_before} idle sessions: "
        f"6 of 6 later calls succeeded in {took * 1000:.0f} ms"
    )


@pytest.mark.parametrize(
    ("message", "unknown"),
    [
        ("Session not found", True),  # the Python SDK's 404
        ("Bad Request: No valid session ID provided", True),  # the TypeScript SDK's 400
        ("Session terminated", True),  # the client SDK's stand-in for a bare 404
        ("Unknown tool: echo", False),
        ("Invalid params", False),
        ("Server returned an error response", False),
    ],
)
def test_which_answers_say_a_session_is_unknown(message: str, unknown: bool) -> None:
    from mcp.shared.exceptions import MCPError

    assert session_unknown(MCPError(-32600, message)) is unknown
