"""MCP as its clients check it: the ``mcp`` SDK's client in both eras (the handshake era,
2025-11-25 and earlier, which every ``mcp`` 1.x host speaks, and 2026-07-28) and
``@modelcontextprotocol/inspector``'s CLI (npm, pinned in tests/js).

A handshake-era host's ``notifications/cancelled`` cancels the run of the call it names;
``serverInfo`` names the service's version; ``Mcp-Name`` padded with blanks names the same tool.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.npm import NODE_MODULES, node
from tests.support.server import Server, launch
from tests.support.waiting import wait_for

KEY = "sk-mcp-conformance"
ERAS = ("legacy", "auto")  # auto: 2026-07-28 with this server
INSPECTOR = NODE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher"


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = launch(
        tmp_path_factory.mktemp("mcp-conformance"),
        {"AGENT_API_KEYS": f"{KEY}=alice", "AGENT_DEMO_SLOW_SECONDS": "0.5"},
    )
    yield server
    server.stop()


@asynccontextmanager
async def connect(server: Server, mode: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30.0)
    transport = streamable_http_client(f"{server.base_url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


def _native(server: Server) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"})


async def _active_run(server: Server, session_id: str) -> str:
    async with _native(server) as http:

        async def active() -> str | None:
            answer = await http.get(f"/v1/sessions/{session_id}")
            run_id = answer.json().get("active_run_id") if answer.status_code == 200 else None
            return run_id if isinstance(run_id, str) else None

        found: str = await wait_for(active, within=10)
        return found


async def _ended(server: Server, run_id: str, within: float) -> dict[str, Any]:
    async with _native(server) as http:

        async def ended() -> dict[str, Any] | None:
            run: dict[str, Any] = (await http.get(f"/v1/runs/{run_id}")).json()
            return run if run["status"] in ("completed", "failed", "cancelled") else None

        found: dict[str, Any] = await wait_for(ended, within=within)
        return found


@pytest.mark.parametrize("mode", ERAS)
async def test_a_cancelled_call_cancels_its_run(mcp_server: Server, mode: str) -> None:
    session_id = f"mcp-cancel-{mode}"
    words = " ".join(f"w{i}" for i in range(40))  # 20 s at 0.5 s a word
    async with connect(mcp_server, mode) as client:
        progressed = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            progressed.set()

        call = asyncio.ensure_future(
            client.call_tool(
                "default",
                {"input": f"slow {words}", "session_id": session_id},
                progress_callback=on_progress,
            )
        )
        await asyncio.wait_for(progressed.wait(), 10)
        run_id = await _active_run(mcp_server, session_id)
        started = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the host stays connected: only its cancellation can end the run this soon
        run = await _ended(mcp_server, run_id, within=5)
        assert run["status"] == "cancelled"
        assert time.monotonic() - started < 5
        # the host goes on using the connection
        after = await client.call_tool("default", {"input": "still here"})
        assert not after.is_error


async def test_a_notification_for_no_call_of_the_caller_is_accepted_and_does_nothing(
    mcp_server: Server,
) -> None:
    async with httpx.AsyncClient(
        base_url=mcp_server.base_url, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:
        answer = await http.post(
            "/mcp",
            headers={
                "Accept": "application/json, text/event-stream",
                "Mcp-Protocol-Version": "2025-11-25",
            },
            json={
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 424242, "reason": "nothing"},
            },
        )
    assert answer.status_code == 202


@pytest.mark.parametrize("mode", ERAS)
async def test_server_info_names_a_version(mcp_server: Server, mode: str) -> None:
    async with connect(mcp_server, mode) as client:
        info = client.server_info
        assert info is not None
        assert info.name == "agent-server" and info.version


def _post_raw(server: Server, headers: str, body: bytes) -> bytes:
    """One request over a bare socket: header values exactly as written."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_a_padded_mcp_name_names_the_same_tool(mcp_server: Server) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "default", "arguments": {"input": "padded"}, "_meta": meta},
        }
    ).encode()
    headers = (
        "Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name:  default \t\r\n"
    )
    data = _post_raw(mcp_server, headers, body)
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
    assert b"You said: padded" in data
    # another name is still refused
    other = headers.replace(" default ", "other")
    assert b" 400 " in _post_raw(mcp_server, other, body).split(b"\r\n", 1)[0]


def _inspector(server: Server, home: Path, *args: str, fails: bool = False) -> Any:
    if not (INSPECTOR / "build" / "index.js").exists():
        node()  # installs the pinned packages, or skips saying how
    done = subprocess.run(
        [
            node(),
            str(INSPECTOR / "build" / "index.js"),
            "--cli",
            f"{server.base_url}/mcp",
            "--header",
            f"Authorization: Bearer {KEY}",
            "--format",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "MCP_CATALOG_PATH": str(home / "c.json")},
    )
    assert (done.returncode != 0) is fails, done.stderr + done.stdout
    return json.loads(done.stderr if fails else done.stdout)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_the_inspector_cli_lists_and_calls(mcp_server: Server, tmp_path: Path, era: str) -> None:
    listed = _inspector(
        mcp_server, tmp_path, "--protocol-era", era, "--method", "tools/list", "--strict"
    )
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["default"]
    called = _inspector(
        mcp_server,
        tmp_path,
        "--protocol-era",
        era,
        "--method",
        "tools/call",
        "--tool-name",
        "default",
        "--tool-arg",
        "input=inspected",
    )
    result = called["result"]
    assert result["isError"] is False
    assert result["content"] == [{"type": "text", "text": "You said: inspected"}]
    assert result["structuredContent"]["status"] == "completed"


def test_the_inspector_cli_sees_a_refused_argument(mcp_server: Server, tmp_path: Path) -> None:
    # a session id that breaks the rule: the server says which argument and why
    refused = _inspector(
        mcp_server,
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "default",
        "--tool-arg",
        "input=x",
        "session_id=a/b",
        fails=True,
    )
    assert refused["error"]["message"].startswith("session_id: 1 to 128 characters")


_LEGACY = {
    "Authorization": f"Bearer {KEY}",
    "Accept": "application/json, text/event-stream",
    "Mcp-Protocol-Version": "2025-11-25",
}


def _call(request_id: int, session_id: str, text: str) -> dict[str, Any]:
    arguments = {"input": text, "session_id": session_id}
    # a progress token: the first progress notification says the call is being read
    params = {"name": "default", "arguments": arguments, "_meta": {"progressToken": request_id}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def _start_call(
    http: httpx.AsyncClient, request_id: int, session_id: str, text: str
) -> asyncio.Future[str]:
    """Post a handshake-era call; once its first progress arrived, the rest of its answer."""
    progressing: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def read() -> str:
        body = []
        async with http.stream(
            "POST", "/mcp", json=_call(request_id, session_id, text), headers=_LEGACY
        ) as answer:
            async for line in answer.aiter_lines():
                body.append(line)
                if "notifications/progress" in line and not progressing.done():
                    progressing.set_result(None)
        if not progressing.done():
            progressing.set_result(None)
        return "\n".join(body)

    task = asyncio.ensure_future(read())
    await asyncio.wait_for(progressing, 10)
    return task


async def _cancel(http: httpx.AsyncClient, request_id: int) -> None:
    notification = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id},
    }
    answer = await http.post("/mcp", json=notification, headers=_LEGACY)
    assert answer.status_code == 202


async def test_a_request_id_names_one_call_at_a_time(mcp_server: Server) -> None:
    slow = "slow " + " ".join(f"w{i}" for i in range(40))
    async with httpx.AsyncClient(base_url=mcp_server.base_url, timeout=30) as http:
        # the same id twice in a row: the first call's record went with it
        for attempt in range(2):
            session_id = f"mcp-raw-{attempt}"
            call = await _start_call(http, 77, session_id, slow)
            run_id = await _active_run(mcp_server, session_id)
            await _cancel(http, 77)
            assert (await _ended(mcp_server, run_id, within=5))["status"] == "cancelled"
            assert '"status":"cancelled"' in await call
        # two calls in flight under one id: the notification cannot tell which, and ends neither
        calls = [await _start_call(http, 78, f"mcp-twin-{i}", "slow a b c") for i in range(2)]
        runs = [await _active_run(mcp_server, f"mcp-twin-{i}") for i in range(2)]
        await _cancel(http, 78)
        for run_id in runs:
            assert (await _ended(mcp_server, run_id, within=10))["status"] == "completed"
        await asyncio.gather(*calls)
