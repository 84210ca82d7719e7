"""Regressions found by this suite, each pinned where it is cheapest to reproduce exactly.

- A run cancelled after it was registered but before its task took its first step never
  ended: the task's body (and its handlers) never ran, so no terminal event, a consumer waiting
  forever, the run and its session held for good. Found by the cancel-against-completion race.
- ``: ping`` comments were followed by a blank line, at which httpx-sse dispatches an empty
  ``message`` event once an id was seen: every keep-alive reached Python clients as an event.
  Found by the SSE round-trip property.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from agent_runtime.agent import AgentCore, AgentRunConfig
from agent_runtime.errors import RunCancelledError
from agent_runtime.events import AgentEvent
from agent_runtime.providers.demo import DemoModel
from tests.support.server import AGENT_SERVER, Server, launch, stop


async def consume(stream: object, into: list[AgentEvent]) -> None:
    async for event in stream:  # type: ignore[attr-defined]
        into.append(event)


async def test_a_run_cancelled_before_its_task_started_ends_once() -> None:
    agent = await AgentCore.create(DemoModel(token_delay=0))
    got: list[AgentEvent] = []
    stream = agent.stream("hello", config=AgentRunConfig(session_id="s", run_id="r1"))
    consumer = asyncio.ensure_future(consume(stream, got))
    # one step of the consumer: it registers the run and creates the run's task, which is
    # scheduled after this test's own next step
    await asyncio.sleep(0)
    assert "r1" in agent.active_runs
    assert agent.cancel_run("r1", "cancel_requested")
    async with asyncio.timeout(5):
        with pytest.raises(RunCancelledError):
            await consumer
    assert [event.type.value for event in got] == ["run.cancelled"]
    assert got[0].reason == "cancel_requested"
    assert agent.active_runs == {} and agent.active_sessions == {}
    # the session is free again
    answer = await agent.chat("again", config=AgentRunConfig(session_id="s"))
    assert answer.content == "You said: again"
    await agent.aclose()


@pytest.fixture(scope="module")
def pinging(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp("pings"),
        {"AGENT_SSE_PING": "0.05", "AGENT_CONFIRMATION_TIMEOUT": "30"},
    )
    yield running
    stop(running, request, failed)


async def test_keepalive_pings_are_not_events_to_httpx_sse(pinging: Server) -> None:
    async with httpx.AsyncClient(base_url=pinging.base_url, timeout=10) as client:
        started = await client.post(
            "/v1/sessions/pings/runs", json={"input": "delete a.txt", "background": True}
        )
        run_id = started.json()["run_id"]
        events_url = f"/v1/runs/{run_id}/events"
        # the run waits for its confirmation: its stream carries pings
        raw = b""
        async with client.stream("GET", events_url) as response:
            async with asyncio.timeout(5):
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if raw.count(b": ping") >= 3:
                        break
        assert b": ping\n" in raw
        # the same stream read by httpx-sse: pings for a while, then the answer, then the end
        seen = []
        answered: asyncio.Task[httpx.Response] | None = None
        async with aconnect_sse(client, "GET", events_url) as source:
            async with asyncio.timeout(10):
                async for sse in source.aiter_sse():
                    seen.append(sse)
                    if sse.event == "custom" and "confirmation_requested" in sse.data:
                        call_id = json.loads(sse.data)["data"]["payload"]["tool_call_id"]
                        answered = asyncio.ensure_future(answer_later(client, run_id, call_id))
        assert answered is not None and (await answered).status_code == 202
        assert all(sse.data and sse.event != "message" for sse in seen), seen
        assert [int(sse.id) for sse in seen] == list(range(1, len(seen) + 1))
        assert seen[-1].event == "run.completed"


async def answer_later(client: httpx.AsyncClient, run_id: str, call_id: str) -> httpx.Response:
    await asyncio.sleep(0.3)  # six pings' worth
    return await client.post(
        "/external-events",
        json={
            "session_id": "pings",
            "run_id": run_id,
            "name": "confirmation_response",
            "payload": {"tool_call_id": call_id, "approved": False},
        },
    )


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_clean_drain_exits_0(tmp_path: Path, workers: int) -> None:
    # uvicorn raised SIGTERM again after its shutdown and the process died of it (143)
    running = launch(tmp_path, {"AGENT_ALLOW_UNSHARED_WORKERS": "1"}, workers=workers)
    try:
        async with running.client() as client:
            answer = await client.post(
                "/v1/sessions/drain/runs", json={"input": "hi", "stream": False}
            )
            assert answer.status_code == 200
        running.signal(signal.SIGTERM)
        assert running.wait(30) == 0, running.log()[-3000:]
    finally:
        running.stop()


def test_a_stdio_mcp_command_not_on_path_is_refused_at_start(tmp_path: Path) -> None:
    # found only at warm-up before, in every worker, while /readyz said "warming up"
    config = tmp_path / "agents.toml"
    config.write_text(
        "[mcp_servers.tools]\ncommand = 'no-such-mcp-server-xyz'\n"
        "[agents.default]\nmcp_servers = ['tools']\n",
        encoding="utf-8",
    )
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
    assert done.returncode == 2, done.stderr
    assert "mcp_servers.tools.command: command 'no-such-mcp-server-xyz' is not on PATH" in (
        done.stderr
    )
