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

The soak runs once per backend (``tests/e2e/conftest.py``'s, ``AGENT_TEST_BACKENDS`` selects):
``default`` (SQLite, the in-process bus) and ``redis+postgres`` (the machine's Redis and
PostgreSQL, a key prefix and a schema of the test's own). On the latter, what a run holds also
lives outside the process, so each batch must also leave there nothing of a run: no session
lock, route, log or live-log key under the prefix once the logs' TTL passed, no run row left
unfinished in PostgreSQL (and one row per accepted run), and its connections to either within
their pools' bounds.
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
from urllib.parse import urlsplit

import asyncpg
import httpx
import psutil
import pytest
import redis.asyncio

from tests.fakes.upstream import FakeUpstream
from tests.support.probes import LEAK_KEYS, idle, rss, state, upstream_sockets
from tests.support.server import (
    KEEPALIVE_EXPIRY,
    Server,
    backend_env,
    launch,
    selected_backends,
    stop,
)
from tests.support.sse import assert_well_formed, open_stream, read_events
from tests.support.upstream import upstream_env
from tests.support.waiting import wait_for

# runs per batch (a warm-up batch, then a measured one); RELIABILITY_CHURN_RUNS overrides
RUNS = int(os.environ.get("RELIABILITY_CHURN_RUNS", "5000"))
# The redis+postgres soak runs fewer, to keep the suite's length: at full size it would add
# 4 to 5 minutes (2 x 5,000 runs at 40 to 65 runs/s on 2 cores, like the default's); 2 x 2,000
# add about 2. Every assertion stays: the counts are exact at any size, and the RSS bound (5%
# of ~175 MiB) still catches a leak of more than ~4.5 KiB a run (~1.8 KiB at 5,000).
# RELIABILITY_CHURN_RUNS_SHARED overrides.
SHARED_RUNS = int(os.environ.get("RELIABILITY_CHURN_RUNS_SHARED", str(min(RUNS, 2000))))
CONCURRENCY = 40
MAX_RUNS = 64  # AGENT_MAX_CONCURRENT_RUNS
LOG_TTL = 2.0
SAMPLES = 3  # looks at an idle server's state, of which the lowest counts
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


# Redis keys under the prefix that belong to one run or session (see app/bus/redis); the
# worker's own (fence counter, bell stream) stay
RUN_KEYS = ("lock", "route", "meta", "log", "live", "reply")
UNFINISHED = ("queued", "running", "waiting")


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[pytest.mark.redis, pytest.mark.postgres])
        if name == "redis+postgres"
        else name
        for name in selected_backends()
    ],
)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of the soak's server: ``default`` or ``redis+postgres``."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def backend_settings(backend: str) -> Iterator[dict[str, str]]:
    """The backend's environment: a Redis prefix and a PostgreSQL schema of the module's own
    (removed after its server stopped), or nothing for the default."""
    with backend_env(backend) as env:
        yield env


@pytest.fixture(scope="module")
def server(
    upstream: FakeUpstream,
    backend: str,
    backend_settings: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp(f"churn-{backend.replace('+', '-')}"),
        {
            **upstream_env(
                upstream,
                AGENT_CONFIRMATION_TIMEOUT="1",
                AGENT_EVENT_LOG_TTL=str(LOG_TTL),
                AGENT_MAX_CONCURRENT_RUNS=str(MAX_RUNS),
                AGENT_CLIENT_TIMEOUT="5",
                AGENT_LOG_LEVEL="warning",
            ),
            **backend_settings,
        },
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
    # who held the session when a start was refused 409: "run", "released" (gone by
    # the time the server looked it up)
    conflicts: collections.Counter[str] = field(default_factory=collections.Counter)
    late_answers: int = 0
    # followed only once its log had expired (a 404; its stored status tells its end)
    expired_before_followed: int = 0
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
            except SessionBusy as busy:
                tally.busy_retries += 1
                tally.conflicts[busy.holder_kind] += 1
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
            return await follow(self.client, run_id, tally)
        body: dict[str, Any] = {"input": "hello there"}
        if kind in ("approve", "deny", "expire"):
            body["input"] = f"delete file-{self.rng.randrange(1000)}.txt"
        elif kind == "run_timeout":
            body = {"input": "this is endless", "run_timeout": 0.3}
        elif kind == "continue":
            body["on_disconnect"] = "continue"
        async with open_stream(self.client, "POST", url, json=body) as (response, events):
            if response.status_code == 409:
                await response.aread()
                raise SessionBusy(response)
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
            return await follow(self.client, run_id, tally)
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
    """A start refused 409 ``session_busy``; ``holder_kind`` says who held the session."""

    def __init__(self, response: httpx.Response) -> None:
        body = response.json()
        assert body["code"] == "session_busy", body
        holder = body.get("active_run_id")
        super().__init__(holder)
        if holder is None:
            self.holder_kind = "released"
        else:
            self.holder_kind = str(holder).partition("_")[0]  # "run" (a 409 names runs only)


def check_started(response: httpx.Response, tally: Tally) -> None:
    if response.status_code == 409:
        raise SessionBusy(response)
    assert response.status_code in (200, 202), response.status_code
    tally.started += 1


# the terminal event a finished run's status stands for
END_OF_STATUS = {"completed": "run.completed", "failed": "run.failed", "cancelled": "run.cancelled"}


async def follow(client: httpx.AsyncClient, run_id: str, tally: Tally) -> str:
    events, response = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    if response.status_code == 404:
        # its log expired (LOG_TTL after its end) before the client came back, which a
        # loaded machine can take that long to do: the run itself must have ended
        tally.expired_before_followed += 1
        assert response.json()["code"] == "not_found", response.text
        run = await client.get(f"/v1/runs/{run_id}")
        assert run.status_code == 200, run.text
        return END_OF_STATUS[run.json()["status"]]
    assert response.status_code == 200, response.status_code
    assert_well_formed(events, run_id)
    return events[-1].type


async def batch(server: Server, size: int, seed: int) -> Tally:
    tally = Tally()
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=size)
    started = time.monotonic()
    limits = httpx.Limits(
        max_connections=4 * CONCURRENCY,
        max_keepalive_connections=CONCURRENCY,
        keepalive_expiry=KEEPALIVE_EXPIRY,
    )
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
    # redis+postgres only: connections to either, keys under the prefix and run rows by status
    redis_sockets: int = 0
    postgres_sockets: int = 0
    redis_keys: collections.Counter[str] = field(default_factory=collections.Counter)
    stored_runs: collections.Counter[str] = field(default_factory=collections.Counter)


async def redis_keys(url: str, prefix: str) -> collections.Counter[str]:
    """The keys under ``prefix`` by kind (``lock``, ``log``, ``fence``, ...)."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    finally:
        await client.aclose()
    return collections.Counter(key.decode()[len(prefix) :].partition(":")[0] for key in keys)


async def stored_runs(database_url: str) -> collections.Counter[str]:
    """The rows of the ``runs`` table, by status."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT status, count(*) AS n FROM runs GROUP BY status")
    finally:
        await connection.close()
    return collections.Counter({str(row["status"]): int(row["n"]) for row in rows})


def sockets_to(server: Server, url: str, default_port: int) -> int:
    """The server's established TCP connections to the port of ``url``."""
    port = urlsplit(url).port or default_port
    connections = psutil.Process(server.process.pid).net_connections(kind="tcp")
    return sum(
        1
        for connection in connections
        if connection.raddr
        and connection.raddr.port == port
        and connection.status == psutil.CONN_ESTABLISHED
    )


async def settle_and_measure(
    server: Server, upstream: FakeUpstream, settings: dict[str, str]
) -> Snapshot:
    """Wait until the server holds nothing of any run and the finished runs' logs expired
    (in Redis too); collect its garbage; measure."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

        async def settled() -> dict[str, Any] | None:
            body = await state(client)
            return body if idle(body) and body["event_logs"] == 0 else None

        await wait_for(settled, within=60)
        await upstream.wait_until(lambda: upstream.active == 0, limit=30)
        keys: collections.Counter[str] = collections.Counter()
        if "AGENT_REDIS_PREFIX" in settings:

            async def expired() -> bool:
                nonlocal keys
                keys = await redis_keys(settings["AGENT_REDIS_URL"], settings["AGENT_REDIS_PREFIX"])
                return not any(keys[kind] for kind in RUN_KEYS)

            # sealed logs lapse LOG_TTL after their run's end; nothing else of a run stays
            try:
                await wait_for(expired, within=LOG_TTL + 30)
            except AssertionError:
                raise AssertionError(f"keys of runs left in Redis: {dict(keys)}") from None
        await asyncio.sleep(0.5)
        await state(client, gc=True)
        # the lowest of a few collections (the first frees what the next count sees): an
        # idle server still has moments of work of its own (the lease renewer and lost-run
        # sweep of a shared bus wait on Redis every few seconds, with a future pending and
        # perhaps a new pooled connection), which a leak outlives but a single look may catch
        samples: list[tuple[int, dict[str, Any], int]] = []
        for _ in range(SAMPLES):
            await asyncio.sleep(0.2)
            body = await state(client, gc=True)
            redis_sockets = (
                sockets_to(server, settings["AGENT_REDIS_URL"], 6379)
                if "AGENT_REDIS_URL" in settings
                else 0
            )
            samples.append((body["pending_futures"] - redis_sockets, body, redis_sockets))
        _, body, redis_sockets = min(samples, key=lambda sample: sample[0])
    process = psutil.Process(server.process.pid)
    snapshot = Snapshot(
        state=body,
        rss=rss(server),
        fds=process.num_fds(),
        upstream_sockets=upstream_sockets(server, upstream),
        upstream_active=upstream.active,
        redis_keys=keys,
        # every open Redis connection holds one pending future: the count the scan saw
        redis_sockets=redis_sockets,
    )
    if "AGENT_DATABASE_URL" in settings:
        snapshot.postgres_sockets = sockets_to(server, settings["AGENT_DATABASE_URL"], 5432)
        snapshot.stored_runs = await stored_runs(settings["AGENT_DATABASE_URL"])
    return snapshot


def runs_counted(server: Server) -> int:
    text = httpx.get(f"{server.base_url}/metrics").text
    return sum(
        int(float(value))
        for value in re.findall(r'^agent_runs_total\{outcome="[a-z_]+"\} (\S+)$', text, re.M)
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_churn_leaves_nothing_behind(
    server: Server, upstream: FakeUpstream, backend: str, backend_settings: dict[str, str]
) -> None:
    runs = RUNS if backend == "default" else SHARED_RUNS
    fresh = rss(server)
    warmup = await batch(server, runs, seed=1)
    baseline = await settle_and_measure(server, upstream, backend_settings)
    counted_before = await asyncio.to_thread(runs_counted, server)
    measured = await batch(server, runs, seed=2)
    after = await settle_and_measure(server, upstream, backend_settings)
    counted_after = await asyncio.to_thread(runs_counted, server)
    gc.collect()

    report = {
        "backend": backend,
        "runs per batch": runs,
        "warm-up seconds": round(warmup.seconds, 1),
        "measured seconds": round(measured.seconds, 1),
        "runs/s": round(runs / measured.seconds, 1),
        "kinds": dict(measured.kinds),
        "ends": {f"{kind}:{end}": count for (kind, end), count in sorted(measured.ends.items())},
        "busy retries": measured.busy_retries,
        "session held by (warm-up, measured)": [dict(warmup.conflicts), dict(measured.conflicts)],
        "late answers": measured.late_answers,
        "followed after its log expired": measured.expired_before_followed,
        "rss MiB (fresh, baseline, after)": [
            round(x / 2**20, 1) for x in (fresh, baseline.rss, after.rss)
        ],
        "python blocks (baseline, after)": [
            baseline.state["allocated_blocks"],
            after.state["allocated_blocks"],
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
    if backend != "default":
        report["redis sockets (baseline, after)"] = [baseline.redis_sockets, after.redis_sockets]
        report["postgres sockets (baseline, after)"] = [
            baseline.postgres_sockets,
            after.postgres_sockets,
        ]
        report["redis keys (after)"] = dict(after.redis_keys)
        report["stored runs (after)"] = dict(after.stored_runs)
    print("churn:", report)

    # every run a client started was counted once when it ended: none lost, none twice
    assert warmup.started == runs and measured.started == runs
    assert counted_before == warmup.started
    assert counted_after - counted_before == measured.started
    assert sum(measured.kinds.values()) == runs
    # a client starts its next run only once it has read the previous one's end (or on a new
    # session), so no start may find its session busy: on Redis the lost-run sweep once took
    # the lock of a run that had just ended where it ran (a regression of that shows up here
    # as conflicts held by "released" or "reaper")
    for tally in (warmup, measured):
        assert not tally.conflicts, tally.conflicts
    # nothing of any run is held: runs, tasks, locks, subscribers, waits, logs
    for snapshot in (baseline, after):
        assert all(snapshot.state[key] == 0 for key in LEAK_KEYS), snapshot.state
        assert snapshot.state["event_logs"] == 0
        assert snapshot.upstream_active == 0
    assert after.state["loop_tasks"] <= baseline.state["loop_tasks"]
    # every open Redis connection holds one pending future (asyncio's StreamReaderProtocol
    # waits for its close) and redis-py's pool keeps its high-water mark of connections:
    # those are bounded below with the sockets, not counted as leaked futures. The worker's
    # own loops (lease renewals, the deadline watchdog, the sweep) each hold a sleep's future
    # at some moments and not at others: a few either way; a leak would grow with the runs
    # (thousands here)
    assert (
        after.state["pending_futures"] - after.redis_sockets
        <= baseline.state["pending_futures"] - baseline.redis_sockets + 3
    )
    # the upstream connections kept are the SDK's idle pool, bounded by the concurrency
    assert after.upstream_sockets <= max(baseline.upstream_sockets, CONCURRENCY)
    assert after.fds <= baseline.fds + CONCURRENCY
    if backend != "default":
        # every accepted run is stored once, and ended there too
        for snapshot in (baseline, after):
            assert not any(snapshot.stored_runs[status] for status in UNFINISHED), snapshot
        assert baseline.stored_runs.total() == warmup.started
        assert after.stored_runs.total() - baseline.stored_runs.total() == measured.started
        # the pools keep connections by how many runs and requests were in flight at once,
        # never by how many ran: asyncpg's is capped (10), redis-py's grows to its high-water
        # (capped at AGENT_REDIS_MAX_CONNECTIONS, 128)
        assert after.postgres_sockets <= max(baseline.postgres_sockets, 10)
        assert after.redis_sockets <= max(baseline.redis_sockets, MAX_RUNS + CONCURRENCY)
    # and the memory is where the warm-up left it. The Python objects' blocks closely: a leak
    # of one small object a run would be thousands here, where a batch leaves about a thousand
    # either way (of some 880,000). The resident size (read after the debug probe handed
    # glibc's free pages back) within a margin for the slack of pymalloc's arenas: 5,000 runs
    # of the default backend leave 4-6% more resident with the same live blocks, and 12,000
    # no more than 5,000, where a leak would keep growing
    assert after.state["allocated_blocks"] <= baseline.state["allocated_blocks"] * 1.02, report
    assert after.rss <= baseline.rss * 1.10, report
