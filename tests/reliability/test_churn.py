"""Churn soak: thousands of runs of every kind against one server; nothing is lost or leaked.

One server process, its model the fake upstream (real SDK, real HTTP connections). Workers
start runs back to back, each of a kind drawn at random: streamed to the end, blocking, the
client vanishing mid-stream, a cancel, a confirmation approved, denied or left to expire, a run
meeting its ``run_timeout`` on a stream that never ends, a client leaving a run that goes on
(``on_disconnect: continue``) and following it again. Every run a client follows to its end
must end once, the way its kind says.

A warm-up batch comes first, of the same size as the measured one. After each batch the server
is left to settle (finished runs' event logs expire: ``AGENT_EVENT_LOG_TTL`` is short here) and
collect its garbage, then measured: every count of ``/debug/state`` (runs, tasks, locks,
subscribers, extension waits, event logs), the loop's tasks and pending futures, the upstream
responses still open, the TCP connections to the upstream, file descriptors, and the RSS. The
measured batch must end where the warm-up left off: no count above it, the RSS within 5%, and
every run the server accepted counted once in ``agent_runs_total``.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import Server, launch
from tests.fakes.upstream import FakeUpstream

from .conftest import (
    LEAK_KEYS,
    assert_well_formed,
    idle,
    open_stream,
    read_events,
    rss,
    state,
    stop,
    upstream_env,
    upstream_sockets,
    wait_for,
)

# runs per batch (a warm-up batch, then a measured one); RELIABILITY_CHURN_RUNS overrides
RUNS = int(os.environ.get("RELIABILITY_CHURN_RUNS", "5000"))
CONCURRENCY = 40
LOG_TTL = 2.0
KINDS: dict[str, int] = {  # kind: weight
    "complete": 28,
    "blocking": 10,
    "disconnect": 12,
    "cancel": 12,
    "approve": 10,
    "deny": 8,
    "expire": 5,
    "run_timeout": 8,
    "continue": 7,
}
EXPECTED: dict[str, set[str]] = {  # the terminal events a kind may end with
    "complete": {"run.completed"},
    "blocking": {"completed"},
    "cancel": {"run.cancelled", "run.completed"},
    "approve": {"run.completed"},
    "deny": {"run.completed"},
    "expire": {"run.completed"},
    "run_timeout": {"run.failed"},
    "continue": {"run.completed"},
}


@pytest.fixture(scope="module")
def server(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp("churn"),
        upstream_env(
            upstream,
            AGENT_CONFIRMATION_TIMEOUT="1",
            AGENT_EVENT_LOG_TTL=str(LOG_TTL),
            AGENT_MAX_CONCURRENT_RUNS="64",
            AGENT_CLIENT_TIMEOUT="5",
            AGENT_LOG_LEVEL="warning",
        ),
    )
    yield running
    stop(running, request, failed)


@dataclass
class Tally:
    """What one batch did."""

    started: int = 0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    ends: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    busy_retries: int = 0
    late_answers: int = 0
    seconds: float = 0.0


class Worker:
    """Runs of random kinds, one after another, on a session of its own (a new one after
    a run it left behind)."""

    def __init__(self, client: httpx.AsyncClient, rng: random.Random, name: str) -> None:
        self.client = client
        self.rng = rng
        self.name = name
        self.sessions = 0
        self.late_answers = 0
        self.session = self._next_session()

    def _next_session(self) -> str:
        self.sessions += 1
        return f"churn-{self.name}-{self.sessions}"

    async def run(self, kind: str, tally: Tally) -> None:
        for _ in range(50):
            try:
                end = await self._run(kind, tally)
            except SessionBusy:
                tally.busy_retries += 1
                await asyncio.sleep(0.01)
                continue
            tally.kinds[kind] += 1
            if end is not None:
                assert end in EXPECTED[kind], (kind, end)
                tally.ends[(kind, end)] += 1
            return
        raise AssertionError(f"session {self.session} stayed busy")

    async def _run(self, kind: str, tally: Tally) -> str | None:
        url = f"/v1/sessions/{self.session}/runs"
        if kind == "blocking":
            response = await self.client.post(url, json={"input": "hello", "stream": False})
            check_started(response, tally)
            result: str = response.json()["status"]
            return result
        if kind == "cancel":
            # against a run that would end soon, or one that would never end
            text = self.rng.choice(["hello there", "wait for the endless one"])
            response = await self.client.post(url, json={"input": text, "background": True})
            check_started(response, tally)
            run_id = response.json()["run_id"]
            await asyncio.sleep(self.rng.uniform(0, 0.02))
            assert (await self.client.post(f"/v1/runs/{run_id}/cancel")).status_code in (200, 202)
            return await follow(self.client, run_id)
        body: dict[str, Any] = {"input": "hello there"}
        if kind in ("approve", "deny", "expire"):
            body["input"] = f"delete file-{self.rng.randrange(1000)}.txt"
        elif kind == "run_timeout":
            body = {"input": "this is endless", "run_timeout": 0.3}
        elif kind == "continue":
            body["on_disconnect"] = "continue"
        async with open_stream(self.client, "POST", url, json=body) as (response, events):
            if response.status_code == 409:
                raise SessionBusy
            check_started(response, tally)
            run_id = response.headers["x-run-id"]
            seen = []
            async for event in events:
                seen.append(event)
                if kind in ("disconnect", "continue") and event.type == "run.started":
                    break  # the client goes away
                asked = (
                    event.type == "custom"
                    and event.data["data"]["name"] == "confirmation_requested"
                )
                if asked and kind != "expire":
                    await self.answer(run_id, event.data["data"]["payload"], kind == "approve")
        if kind == "disconnect":
            self.session = self._next_session()  # its run may still be ending
            return None
        if kind == "continue":
            return await follow(self.client, run_id)
        assert_well_formed(seen, run_id)
        return seen[-1].type

    async def answer(self, run_id: str, payload: dict[str, Any], approved: bool) -> None:
        response = await self.client.post(
            "/external-events",
            json={
                "session_id": self.session,
                "run_id": run_id,
                "name": "confirmation_response",
                "payload": {"tool_call_id": payload["tool_call_id"], "approved": approved},
            },
        )
        if response.status_code == 409:
            # refused only if it came after the request expired (a loaded machine is slow)
            expires = datetime.fromisoformat(payload["expires_at"].replace("Z", "+00:00"))
            assert datetime.now(UTC) >= expires - timedelta(milliseconds=50), response.text
            self.late_answers += 1
            return
        assert response.status_code == 202, response.text


class SessionBusy(Exception):
    """The worker's session still had a run (one it left behind)."""


def check_started(response: httpx.Response, tally: Tally) -> None:
    if response.status_code == 409:
        raise SessionBusy
    assert response.status_code in (200, 202), response.status_code
    tally.started += 1


async def follow(client: httpx.AsyncClient, run_id: str) -> str:
    events, response = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    assert response.status_code == 200, response.status_code
    assert_well_formed(events, run_id)
    return events[-1].type


async def batch(server: Server, size: int, seed: int) -> Tally:
    tally = Tally()
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=size)
    started = time.monotonic()
    limits = httpx.Limits(max_connections=4 * CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30, limits=limits) as client:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for kind in kinds:
            queue.put_nowait(kind)

        async def work(index: int) -> None:
            worker = Worker(client, random.Random(seed * 1000 + index), f"{seed}-{index}")
            while not queue.empty():
                await worker.run(queue.get_nowait(), tally)
            tally.late_answers += worker.late_answers

        await asyncio.gather(*(work(index) for index in range(CONCURRENCY)))
    tally.seconds = time.monotonic() - started
    return tally


@dataclass
class Snapshot:
    state: dict[str, Any]
    rss: int
    fds: int
    upstream_sockets: int
    upstream_active: int


async def settle_and_measure(server: Server, upstream: FakeUpstream) -> Snapshot:
    """Wait until the server holds nothing of any run and the finished runs' logs expired;
    collect its garbage; measure."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

        async def settled() -> dict[str, Any] | None:
            body = await state(client)
            return body if idle(body) and body["event_logs"] == 0 else None

        await wait_for(settled, within=60)
        await upstream.wait_until(lambda: upstream.active == 0, limit=30)
        await asyncio.sleep(0.5)
        body = await state(client, gc=True)
        await asyncio.sleep(0.2)
        body = await state(client, gc=True)  # a second collection: what the first freed
    process = psutil.Process(server.process.pid)
    return Snapshot(
        state=body,
        rss=rss(server),
        fds=process.num_fds(),
        upstream_sockets=upstream_sockets(server, upstream),
        upstream_active=upstream.active,
    )


def runs_counted(server: Server) -> int:
    text = httpx.get(f"{server.base_url}/metrics").text
    return sum(
        int(float(value))
        for value in re.findall(r'^agent_runs_total\{outcome="[a-z_]+"\} (\S+)$', text, re.M)
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_churn_leaves_nothing_behind(server: Server, upstream: FakeUpstream) -> None:
    fresh = rss(server)
    warmup = await batch(server, RUNS, seed=1)
    baseline = await settle_and_measure(server, upstream)
    counted_before = await asyncio.to_thread(runs_counted, server)
    measured = await batch(server, RUNS, seed=2)
    after = await settle_and_measure(server, upstream)
    counted_after = await asyncio.to_thread(runs_counted, server)
    gc.collect()

    report = {
        "runs per batch": RUNS,
        "warm-up seconds": round(warmup.seconds, 1),
        "measured seconds": round(measured.seconds, 1),
        "runs/s": round(RUNS / measured.seconds, 1),
        "kinds": dict(measured.kinds),
        "ends": {f"{kind}:{end}": count for (kind, end), count in sorted(measured.ends.items())},
        "busy retries": measured.busy_retries,
        "late answers": measured.late_answers,
        "rss MiB (fresh, baseline, after)": [
            round(x / 2**20, 1) for x in (fresh, baseline.rss, after.rss)
        ],
        "fds (baseline, after)": [baseline.fds, after.fds],
        "upstream sockets (baseline, after)": [baseline.upstream_sockets, after.upstream_sockets],
        "loop tasks (baseline, after)": [
            baseline.state["loop_tasks"],
            after.state["loop_tasks"],
        ],
        "pending futures (baseline, after)": [
            baseline.state["pending_futures"],
            after.state["pending_futures"],
        ],
    }
    print("churn:", report)

    # every run a client started was counted once when it ended: none lost, none twice
    assert warmup.started == RUNS and measured.started == RUNS
    assert counted_before == warmup.started
    assert counted_after - counted_before == measured.started
    assert sum(measured.kinds.values()) == RUNS
    # nothing of any run is held: runs, tasks, locks, subscribers, waits, logs
    for snapshot in (baseline, after):
        assert all(snapshot.state[key] == 0 for key in LEAK_KEYS), snapshot.state
        assert snapshot.state["event_logs"] == 0
        assert snapshot.upstream_active == 0
    assert after.state["loop_tasks"] <= baseline.state["loop_tasks"]
    assert after.state["pending_futures"] <= baseline.state["pending_futures"]
    # the upstream connections kept are the SDK's idle pool, bounded by the concurrency
    assert after.upstream_sockets <= max(baseline.upstream_sockets, CONCURRENCY)
    assert after.fds <= baseline.fds + CONCURRENCY
    # and the memory is where the warm-up left it
    assert after.rss <= baseline.rss * 1.05, report
