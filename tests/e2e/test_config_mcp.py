"""Agents from ``AGENT_CONFIG`` with real MCP servers, through a real ``agent-server`` process.

One server for the module, configured by a TOML file: the ``tester`` agent runs the scripted
``tool_caller`` model (``python:tests.fakes.config_models:tool_caller``) with three MCP servers,
all the fake server of ``tests.fakes.mcp_servers``: ``local`` over stdio (one pooled session),
``remote`` over streamable HTTP (a pool of 2 sessions), and ``admin``, the same HTTP server
without a pool, through which the tests read the server's stats and open its gate.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.mcp_servers import HttpServerProcess, stdio_command
from tests.support.server import AGENT_SERVER, Server, launch
from tests.support.sse import assert_well_formed, open_stream, read_events
from tests.support.waiting import wait_for

TOOL_CALLER = "python:tests.fakes.config_models:tool_caller"


def agents_toml() -> str:
    command, args, cwd = stdio_command()
    return f"""
[mcp_servers.local]
command = {json.dumps(command)}
args = {json.dumps(args)}
cwd = {json.dumps(cwd)}
session_pool_size = 1
timeout = 20

[mcp_servers.remote]
url = "${{FAKE_MCP_URL}}"
session_pool_size = 2
timeout = 20

[mcp_servers.admin]
url = "${{FAKE_MCP_URL}}"
allowed_tools = ["stats", "open_gate"]

[agents.tester]
model = "{TOOL_CALLER}"
system_prompt = "You test MCP tools."
max_iterations = 4
mcp_servers = ["local", "remote", "admin"]

[agents.tester.policies]
"remote__echo*" = "ask"
"""


@pytest.fixture(scope="module")
def mcp_http() -> Iterator[HttpServerProcess]:
    server = HttpServerProcess()
    yield server
    server.close()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, mcp_http: HttpServerProcess
) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("config-mcp")
    config = directory / "agents.toml"
    config.write_text(agents_toml(), encoding="utf-8")
    running = launch(
        directory / "server", {"AGENT_CONFIG": str(config), "FAKE_MCP_URL": mcp_http.url}
    )
    yield running
    running.stop()
    log = running.log()
    # the agents closed, then the MCP clients (the stdio server's process with them)
    assert "Application shutdown complete" in log, log[-5000:]
    assert "Traceback" not in log, log[-5000:]


async def run(client: httpx.AsyncClient, session: str, text: str) -> dict[str, Any]:
    """A blocking run of the tester agent; its JSON result."""
    response = await client.post(
        f"/v1/sessions/{session}/runs",
        json={"input": text, "stream": False, "agent": "tester"},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def admin_stats(client: httpx.AsyncClient, session: str) -> dict[str, Any]:
    """The fake server's stats, through the admin server's tool."""
    body = await run(client, session, "call admin__stats {}")
    content = body["output"]["content"]
    prefix = "admin__stats -> "
    assert content.startswith(prefix), content
    stats: dict[str, Any] = json.loads(content[len(prefix) :])
    return stats


async def test_mcp_tools_are_discovered_at_warm_up_and_called(server: Server) -> None:
    async with server.client() as client:
        tools = (await run(client, "discover", "tools"))["output"]["content"].split(",")
        assert {"local__add", "local__die", "remote__add", "remote__echo_text"} <= set(tools)
        assert {"admin__stats", "admin__open_gate"} == {t for t in tools if t.startswith("admin")}
        prompt = (await run(client, "discover", "system"))["output"]["content"]
        assert prompt == "You test MCP tools."

        for transport in ("local", "remote"):
            events, response = await read_events(
                client,
                "POST",
                f"/v1/sessions/call-{transport}/runs",
                json={"input": f'call {transport}__add {{"a": 2, "b": 3}}', "agent": "tester"},
            )
            assert response.status_code == 200
            run_id = response.headers["x-run-id"]
            assert_well_formed(events, run_id)
            assert events[0].data["data"] == {"agent": "tester", "model": "tool-caller"}
            started = next(e for e in events if e.type == "tool.call.started").data["data"]
            assert started["name"] == f"{transport}__add"
            assert started["arguments"] == {"a": 2, "b": 3}
            completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
            assert completed["is_error"] is False
            assert completed["result"] == "5"
            assert events[-1].type == "run.completed"
            assert events[-1].data["data"]["output"] == {"content": f"{transport}__add -> 5"}


async def test_an_ask_policy_on_an_mcp_tool_is_confirmed_over_http(server: Server) -> None:
    async with server.client() as client:
        before = (await admin_stats(client, "ask-stats"))["calls"].get("echo.text", 0)
        for approved in (False, True):
            session = f"ask-{approved}"
            body = {"input": 'call remote__echo_text {"text": "hello"}', "agent": "tester"}
            seen: list[str] = []
            async with open_stream(client, "POST", f"/v1/sessions/{session}/runs", json=body) as (
                response,
                events,
            ):
                run_id = response.headers["x-run-id"]
                async for event in events:
                    seen.append(event.type)
                    data = event.data["data"]
                    if event.type == "custom" and data["name"] == "confirmation_requested":
                        payload = data["payload"]
                        assert payload["tool"] == "remote__echo_text"
                        assert payload["arguments"] == {"text": "hello"}
                        answer = await client.post(
                            "/external-events",
                            json={
                                "session_id": session,
                                "run_id": run_id,
                                "name": "confirmation_response",
                                "payload": {
                                    "tool_call_id": payload["tool_call_id"],
                                    "approved": approved,
                                },
                            },
                        )
                        assert answer.status_code == 202, answer.text
                    elif event.type == "tool.call.completed":
                        assert data["is_error"] is not approved
                        if approved:
                            assert data["result"] == "hello"
                    elif event.type == "run.completed":
                        content = data["output"]["content"]
                        expected = "-> hello" if approved else "failed:"
                        assert expected in content, content
            assert seen[-1] == "run.completed"
            assert "custom" in seen
        after = (await admin_stats(client, "ask-stats"))["calls"].get("echo.text", 0)
        assert after == before + 1  # the denied call never reached the server


async def test_a_pool_of_two_sessions_under_ten_concurrent_calls(server: Server) -> None:
    async with server.client() as client:
        run_ids: list[str] = []
        for index in range(10):
            started = await client.post(
                f"/v1/sessions/pool-{index}/runs",
                json={
                    "input": f'call remote__work {{"tag": "t{index}"}}',
                    "agent": "tester",
                    "background": True,
                },
            )
            assert started.status_code == 202, started.text
            run_ids.append(started.json()["run_id"])

        async def two_in_flight() -> bool:
            return bool((await admin_stats(client, "pool-admin"))["in_flight"] == 2)

        await wait_for(two_in_flight)
        statuses = [(await client.get(f"/v1/runs/{r}")).json()["status"] for r in run_ids]
        assert statuses == ["running"] * 10  # 2 calls at the server, 8 waiting for a session

        opened = await run(client, "pool-admin", "call admin__open_gate {}")
        assert opened["output"]["content"] == "admin__open_gate -> open"

        async def all_done() -> list[dict[str, Any]] | None:
            runs = [(await client.get(f"/v1/runs/{r}")).json() for r in run_ids]
            return runs if all(r["status"] == "completed" for r in runs) else None

        finished = await wait_for(all_done)
        assert sorted(r["output"]["content"] for r in finished) == sorted(
            f"remote__work -> done t{index}" for index in range(10)
        )
        stats = await admin_stats(client, "pool-admin")
        assert stats["max_in_flight"] == 2
        assert stats["calls"]["work"] == 10
        # every admin call opens a session of its own (no pool), plus one listed its tools at
        # warm-up; the rest are remote's: its pool opened 2 sessions for all its calls
        calls = stats["calls"]
        admin_sessions = 1 + calls["stats"] + calls["open_gate"]
        assert stats["handshakes"]["agent-runtime"] - admin_sessions == 2


async def test_a_server_that_dies_mid_call_fails_the_call_not_the_run(server: Server) -> None:
    async with server.client() as client:
        events, response = await read_events(
            client,
            "POST",
            "/v1/sessions/dies/runs",
            json={"input": "call local__die {}", "agent": "tester"},
        )
        assert response.status_code == 200
        assert_well_formed(events, response.headers["x-run-id"])
        completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
        assert completed["name"] == "local__die"
        assert completed["is_error"] is True
        assert "local" in completed["error"]
        assert events[-1].type == "run.completed"
        assert events[-1].data["data"]["output"]["content"].startswith("local__die failed:")
        # the dead session was replaced: the server answers the next call
        again = await run(client, "dies", 'call local__add {"a": 1, "b": 1}')
        assert again["output"]["content"] == "local__add -> 2"


async def test_an_unknown_agent_is_404(server: Server) -> None:
    async with server.client() as client:
        response = await client.post(
            "/v1/sessions/unknown/runs", json={"input": "x", "agent": "nobody"}
        )
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[agents.research]\nmax_iterations = 0\n", "agents.research.max_iterations"),
        ("[agents.x]\nmcp_servers = ['ghost']\n", "agents.x.mcp_servers[0]"),
    ],
)
def test_a_bad_file_stops_start_up(tmp_path: Path, text: str, key: str) -> None:
    config = tmp_path / "agents.toml"
    config.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["AGENT_CONFIG"] = str(config)
    done = subprocess.run(
        [str(AGENT_SERVER), "--port", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{config}: {key}: " in done.stderr
