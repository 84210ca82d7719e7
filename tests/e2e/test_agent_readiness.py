"""Readiness per agent, through a real ``agent-server`` process: one agent whose MCP server is
unreachable, one whose upstream always fails, beside agents that work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, status
from tests.support.server import Server, free_port, launch


@pytest.fixture(scope="module")
def failing_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread(default=status(500, "always down")) as upstream:
        yield upstream


def agents_toml(*, files_required: bool) -> str:
    closed = free_port()  # nothing listens there
    return f"""
[mcp_servers.gone]
url = "http://127.0.0.1:{closed}/mcp"
timeout = 2

[agents.helper]
model = "demo"

[agents.files]
model = "demo"
mcp_servers = ["gone"]
required = {"true" if files_required else "false"}

[agents.broken]
model = "openai:broken"
required = false
"""


def start(tmp_path: Path, upstream: FakeUpstream, *, files_required: bool, **kw: Any) -> Server:
    config = tmp_path / "agents.toml"
    config.write_text(agents_toml(files_required=files_required), encoding="utf-8")
    env = {
        "AGENT_CONFIG": str(config),
        "AGENT_DATABASE_URL": f"sqlite:///{tmp_path}/agent.db",
        "OPENAI_BASE_URL": upstream.openai_url,
        "OPENAI_API_KEY": "sk-readiness-0123456789",
        "AGENT_CLIENT_MAX_RETRIES": "0",
    }
    return launch(tmp_path / "server", env, **kw)


def warmed(answer: httpx.Response) -> bool:
    """Every agent's first warm-up attempt is over."""
    if answer.headers.get("content-type", "").find("json") < 0:
        return False
    agents = answer.json().get("agents", {})
    return bool(agents) and all(entry["status"] != "starting" for entry in agents.values())


async def run(client: httpx.AsyncClient, agent: str) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/s-{agent}/runs", json={"input": "hi", "stream": False, "agent": agent}
    )


async def test_an_optional_agent_that_fails_warm_up_leaves_the_worker_ready(
    tmp_path: Path, failing_upstream: FakeUpstream
) -> None:
    server = start(tmp_path, failing_upstream, files_required=False)
    try:
        async with server.client() as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            agents = ready.json()["agents"]
            assert agents["default"] == {"status": "ready", "required": True}
            assert agents["helper"] == {"status": "ready", "required": True}
            files, broken = agents["files"], agents["broken"]
            assert (files["status"], files["required"]) == ("unavailable", False)
            # the reason names the server and the configuration key
            assert "MCP server 'gone'" in files["reason"]
            assert "agents.files.mcp_servers" in files["reason"]
            assert "could not be reached" in files["reason"]
            assert (broken["status"], broken["required"]) == ("unavailable", False)
            assert broken["reason"].startswith("agents.broken.model: the warm-up run failed")
            assert "HTTP 500" in broken["reason"]
            assert "sk-readiness" not in ready.text

            refused = await run(client, "files")
            assert refused.status_code == 503
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert int(refused.headers["retry-after"]) > 0
            problem = refused.json()
            assert (problem["code"], problem["agent"]) == ("agent_unavailable", "files")
            assert problem["reason"] == files["reason"]
            assert "agent 'files' is unavailable: MCP server 'gone'" in problem["detail"]
            assert (await run(client, "broken")).json()["code"] == "agent_unavailable"

            served = await run(client, "helper")
            assert served.status_code == 200, served.text
            assert served.json()["status"] == "completed"
            metrics = (await client.get("/metrics")).text
            assert 'agent_runs_rejected_total{reason="agent_unavailable"} 2.0' in metrics
    finally:
        server.stop()


async def test_a_required_agent_that_fails_keeps_the_worker_unready(
    tmp_path: Path, failing_upstream: FakeUpstream
) -> None:
    server = start(tmp_path, failing_upstream, files_required=True, until=warmed)
    try:
        async with server.client() as client:
            answer = await client.get("/readyz")
            assert answer.status_code == 503
            problem = answer.json()
            assert problem["code"] == "starting"
            # the problem names the required agent and what failed, not the optional one
            assert "agent 'files' is unavailable (MCP server 'gone'" in problem["detail"]
            assert "agents.files.mcp_servers" in problem["detail"]
            assert "broken" not in problem["detail"]
            assert problem["agents"]["files"]["required"] is True
            # the worker still serves the agents that work
            served = await run(client, "helper")
            assert served.status_code == 200, served.text
            assert (await run(client, "files")).status_code == 503
    finally:
        server.stop()
