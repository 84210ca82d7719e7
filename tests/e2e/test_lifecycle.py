"""Shutdown with open streams, and clients that vanish mid-run: a real server process."""

from __future__ import annotations

import asyncio
import collections
import signal
import uuid
from typing import Any

import httpx
import pytest

from tests.support.server import Launch
from tests.support.sse import Event, assert_well_formed, open_stream
from tests.support.waiting import wait_for

# long (drains, 200 clients): in the slow set, which CI runs
pytestmark = pytest.mark.slow

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
)


def new_session() -> str:
    return f"life-{uuid.uuid4().hex[:12]}"


class Stream:
    """One streamed run read to its end in a task; ``started`` once its first event came."""

    def __init__(self, client: httpx.AsyncClient, text: str) -> None:
        self.client = client
        self.text = text
        self.session = new_session()
        self.events: list[Event] = []
        self.run_id = ""
        self.started = asyncio.Event()
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async with open_stream(
            self.client,
            "POST",
            f"/v1/sessions/{self.session}/runs",
            json={"input": self.text},
        ) as (response, events):
            assert response.status_code == 200, await response.aread()
            self.run_id = response.headers["x-run-id"]
            async for event in events:
                self.events.append(event)
                self.started.set()


async def test_sigterm_drains_fifty_open_streams(start_server: Launch) -> None:
    # resume off: with a shared bus the long runs would be handed over at the drain timeout
    # (tests/scale/test_durable_runs.py); this is the path that cancels them
    server = start_server(
        {"AGENT_DRAIN_TIMEOUT": "2", "AGENT_DEMO_SLOW_SECONDS": "0.1", "AGENT_RESUME_RUNS": "0"}
    )
    async with server.client() as client:
        # "slow a b" ends in ~0.4 s; 60 slow words would take 6 s, beyond the drain timeout
        short = [Stream(client, "slow a b") for _ in range(25)]
        long = [Stream(client, "slow " + " ".join(["w"] * 60)) for _ in range(25)]
        everyone = short + long
        async with asyncio.timeout(20):
            await asyncio.gather(*(s.started.wait() for s in everyone))
        server.signal(signal.SIGTERM)

        async def draining() -> bool:
            response = await client.get("/readyz")
            return response.status_code == 503

        await wait_for(draining, within=5)
        refused = await client.post(f"/v1/sessions/{new_session()}/runs", json={"input": "x"})
        assert refused.status_code == 503
        assert refused.json()["code"] == "draining"
        assert refused.headers["retry-after"]
        async with asyncio.timeout(30):
            await asyncio.gather(*(s.task for s in everyone))
    for stream in everyone:
        assert_well_formed(stream.events, stream.run_id)
    for stream in short:
        assert stream.events[-1].type == "run.completed"
    for stream in long:
        assert stream.events[-1].type == "run.cancelled"
        assert stream.events[-1].data["data"] == {"reason": "shutdown"}
    code = server.wait(30)
    assert code == 0, server.log()  # a drained shutdown is a success
    log = server.log()
    assert "drain timeout: cancelling runs" in log
    assert "Application shutdown complete" in log
    # the store kept every outcome: after a restart on the same files, nothing is "running"
    restarted = start_server({}, directory=server.directory)
    async with restarted.client() as client:
        for stream in everyone:
            run = (await client.get(f"/v1/runs/{stream.run_id}")).json()
            assert run["status"] == stream.events[-1].type.removeprefix("run.")


async def test_sigterm_with_several_workers(start_server: Launch) -> None:
    # each worker drains its own runs: no shared bus needed for that
    server = start_server(
        {
            "AGENT_DRAIN_TIMEOUT": "1",
            "AGENT_DEMO_SLOW_SECONDS": "0.1",
            "AGENT_ALLOW_UNSHARED_WORKERS": "1",
            "AGENT_RESUME_RUNS": "0",  # cancelled at the drain timeout, not handed over
        },
        workers=2,
    )
    async with server.client() as client:
        streams = [Stream(client, "slow a") for _ in range(4)] + [
            Stream(client, "slow " + " ".join(["w"] * 60)) for _ in range(4)
        ]
        async with asyncio.timeout(20):
            await asyncio.gather(*(s.started.wait() for s in streams))
        server.signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await asyncio.gather(*(s.task for s in streams))
    for stream in streams:
        assert_well_formed(stream.events, stream.run_id)
    assert {s.events[-1].type for s in streams[:4]} == {"run.completed"}
    for stream in streams[4:]:
        assert stream.events[-1].data["data"] == {"reason": "shutdown"}
    server.wait(30)


async def vanish(client: httpx.AsyncClient) -> tuple[str, str]:
    """Start a streamed run, read until its first text, and drop the connection."""
    session = new_session()
    async with open_stream(
        client,
        "POST",
        f"/v1/sessions/{session}/runs",
        json={"input": "slow " + " ".join(["w"] * 30)},
    ) as (response, events):
        run_id = response.headers["x-run-id"]
        async for event in events:
            if event.type == "text.delta":
                break
    return session, run_id


async def test_two_hundred_clients_vanish_mid_run(start_server: Launch) -> None:
    # a short disconnect grace: each run is cancelled well before its last word, however
    # loaded the machine (the grace's own timers are part of what must leave nothing behind)
    # resume on: a run whose lease lapses under this load is resumed, and cancelled there all
    # the same once no reader renews its mark (every second here) within a renewal period
    server = start_server(
        {
            "AGENT_MAX_CONCURRENT_RUNS": "256",
            "AGENT_DISCONNECT_GRACE": "0.2",
            "AGENT_SSE_PING": "1",
        }
    )
    async with server.client() as client:
        gone = await asyncio.gather(*(vanish(client) for _ in range(200)))

        async def idle() -> dict[str, Any] | None:
            state: dict[str, Any] = (await client.get("/debug/state")).json()
            pending = [
                counts
                for counts in state["extensions"].values()
                if counts["pending"] or counts["staged"]
            ]
            return state if all(state[k] == 0 for k in LEAK_KEYS) and not pending else None

        state = await wait_for(idle, within=30)
        assert state["runs"] == 0

        async def outcome(run_id: str) -> tuple[str, Any]:
            run = (await client.get(f"/v1/runs/{run_id}")).json()
            async with open_stream(
                client, "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "1"}
            ) as (_, events):
                last = [event async for event in events][-1]
            return run["status"], last.data["data"]

        outcomes = await asyncio.gather(*(outcome(run_id) for _, run_id in gone))
    statuses = collections.Counter(status for status, _ in outcomes)
    assert set(statuses) == {"cancelled"}, statuses
    assert all(data == {"reason": "client_disconnected"} for _, data in outcomes)
