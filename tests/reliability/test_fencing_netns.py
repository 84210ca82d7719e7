"""Fencing across real network namespaces: a worker cut off from Redis stops acting for its runs.

Three ``agent-server`` workers (A, B, C), each in a network namespace of its own, reach Redis,
PostgreSQL and the fake model upstream over their veth pair's host address (proxies in the
test process listen there); the test reaches each worker at its namespace's address. The
agent (``AGENT_CONFIG``) has one side-effecting tool, ``append_line``, that needs approval and
appends a line to a file: a call made where it must not be is visible after the fact.

Two ways of losing the lease, each with a run on A waiting for its tool's approval:

- ``iptables -A OUTPUT -d <redis> -j DROP`` inside A's namespace (A still reaches PostgreSQL
  and its clients): B's sweep fails A's run as ``worker_lost``; the late approval sent to A
  gets no 202; A's ``GET /v1/runs/{id}`` never says the run is live past the lease deadline;
  the stream of A's run ends without a terminal event; a stream on A of a run held by B keeps
  its pings while Redis is unreachable.
- ``ip link set <veth> down`` inside A's namespace: A reaches nothing; it fences its run off
  during the outage (its own log says when), not once the link is back.

In both, the approved tool never runs on A, and the run's status, the session's messages
(PostgreSQL) and the run's event log agree.

Needs root (namespaces, veth pairs, iptables): skipped otherwise, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from tests.fakes.tcp_proxy import FaultyProxy
from tests.fakes.upstream import (
    Behaviour,
    FakeToolCall,
    FakeUpstream,
    RecordedRequest,
    Respond,
    Text,
    ToolCalls,
)
from tests.support.server import AGENT_SERVER
from tests.support.upstream import CANARY, demo_like, last_message

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
PORT = 8000
LEASE_SECONDS = 6.0
TTL = LEASE_SECONDS * 2 / 3  # the lease's time to live in Redis: 4 s
DEADLINE = TTL * 0.9  # a run is fenced off 3.6 s after its last confirmed renewal
PING = 1.0
START_TIMEOUT = 120.0

_APPEND = re.compile(r"\bappend\s+(\S+)", re.IGNORECASE)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it makes network namespaces, veth pairs and iptables rules"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs {tool!r} (Debian: apt-get install iproute2 iptables)"
    return None


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


@dataclass
class Netns:
    """A network namespace joined to the host by a veth pair on a /24 of its own."""

    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _sh("ip", "netns", "exec", self.name, *args, check=check)


@contextlib.contextmanager
def namespaces(count: int, octets: range = range(200, 250)) -> Iterator[list[Netns]]:
    """``count`` namespaces, removed (with their veth pairs) on exit, whatever happened; their
    /24s are ``10.<octet>.<i>.0``, the octet drawn from ``octets`` (clusters alive at once
    draw from ranges of their own)."""
    tag = secrets.token_hex(2)
    octet = octets[secrets.randbelow(len(octets))]
    made: list[Netns] = []
    try:
        for i in range(1, count + 1):
            ns = Netns(
                f"fence-{tag}-{i}",
                f"vfh{tag}{i}",
                f"vfn{tag}{i}",
                f"10.{octet}.{i}.1",
                f"10.{octet}.{i}.2",
            )
            _sh("ip", "netns", "add", ns.name)
            made.append(ns)
            _sh("ip", "link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
            _sh("ip", "link", "set", ns.ns_if, "netns", ns.name)
            _sh("ip", "addr", "add", f"{ns.host_ip}/24", "dev", ns.host_if)
            _sh("ip", "link", "set", ns.host_if, "up")
            ns.run("ip", "addr", "add", f"{ns.ns_ip}/24", "dev", ns.ns_if)
            ns.run("ip", "link", "set", ns.ns_if, "up")
            ns.run("ip", "link", "set", "lo", "up")
        yield made
    finally:
        for ns in made:
            _sh("ip", "netns", "del", ns.name, check=False)  # takes its end of the pair along
            _sh("ip", "link", "del", ns.host_if, check=False)


@dataclass
class Worker:
    """An ``agent-server`` process inside a namespace."""

    name: str
    ns: Netns
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.ns.ns_ip}:{PORT}"

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(10.0))

    def log(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
        return entries

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


def _behaviour(request: RecordedRequest) -> Behaviour:
    """``append NAME`` calls the side-effecting tool; anything else as the demo model."""
    tool_result, prompt = last_message(request)
    if tool_result:
        return Text(f"The tool said: {prompt[:60]}")
    found = _APPEND.search(prompt)
    if found is not None:
        return ToolCalls([FakeToolCall("append_line", {"text": found.group(1)})])
    if prompt.startswith("stream "):
        # a long answer, a word every 0.1 s: still streaming well past a cut and a lease
        return Text(prompt, delay=0.1)
    return demo_like(request)


def _via(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}:{port}" if user else f"{host}:{port}"))


@dataclass
class Cluster:
    workers: dict[str, Worker]
    redis_port: int
    database_url: str  # from the host's namespace
    effects: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three workers whose fenced-off runs end ``worker_lost`` (no resume)."""
    yield from _cluster(tmp_path_factory, resume=False)


@pytest.fixture(scope="module")
def resuming_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three workers that resume a fenced-off run from its checkpoint (the default)."""
    yield from _cluster(tmp_path_factory, resume=True)


def _cluster(tmp_path_factory: pytest.TempPathFactory, *, resume: bool) -> Iterator[Cluster]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from tests.support.services import shared_backend

    directory = tmp_path_factory.mktemp("fencing")
    effects = directory / "effects.txt"
    config = directory / "agents.toml"
    config.write_text(
        '[agents.default]\ntools = ["tests.support.fencing_tools:append_line"]\n',
        encoding="utf-8",
    )
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(shared_backend())
        redis_port = urlsplit(env["AGENT_REDIS_URL"]).port or 6379
        pg_port = urlsplit(env["AGENT_DATABASE_URL"]).port or 5432
        redis = stack.enter_context(FaultyProxy(redis_port, listen_host="0.0.0.0"))
        pg = stack.enter_context(FaultyProxy(pg_port, listen_host="0.0.0.0"))
        upstream = stack.enter_context(
            FakeUpstream.in_thread(default=Respond(_behaviour), host="0.0.0.0")
        )
        nss = stack.enter_context(namespaces(3, range(150, 200) if resume else range(200, 250)))
        base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
        workers: dict[str, Worker] = {}

        def stop_all() -> None:
            for worker in workers.values():
                worker.stop()

        stack.callback(stop_all)
        for name, ns in zip("ABC", nss, strict=True):
            worker_env = {
                **base,
                "PYTHONPATH": str(ROOT),
                "AGENT_CONFIG": str(config),
                "AGENT_MODEL": "openai:fake-model",
                "OPENAI_BASE_URL": f"http://{ns.host_ip}:{upstream.port}/v1",
                "OPENAI_API_KEY": CANARY,
                "AGENT_CLIENT_MAX_RETRIES": "0",
                "AGENT_CLIENT_TIMEOUT": "5",
                "AGENT_REDIS_URL": _via(env["AGENT_REDIS_URL"], ns.host_ip, redis.port),
                "AGENT_REDIS_PREFIX": env["AGENT_REDIS_PREFIX"],
                "AGENT_DATABASE_URL": _via(env["AGENT_DATABASE_URL"], ns.host_ip, pg.port),
                "AGENT_LEASE_SECONDS": str(LEASE_SECONDS),
                "AGENT_RESUME_RUNS": "1" if resume else "0",
                # a Redis call gives up well before the lease's deadline: a streaming run's
                # append fails while its lease still has time left (the partition case)
                "AGENT_BACKEND_TIMEOUT": "1" if resume else "5",
                "AGENT_SSE_PING": str(PING),
                "AGENT_CONFIRMATION_TIMEOUT": "120",
                "AGENT_DEBUG_ENDPOINTS": "1",
                # clients reach the worker at its namespace's address, not a loopback name
                "AGENT_ALLOWED_HOSTS": ns.ns_ip,
                "AGENT_LOG_LEVEL": "info",
                "FENCING_EFFECTS": str(effects),
                "FENCING_WORKER": name,
            }
            log_path = directory / f"worker-{name}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns.name,
                        str(AGENT_SERVER),
                        "--host",
                        "0.0.0.0",
                        "--port",
                        str(PORT),
                    ],
                    cwd=directory,
                    env=worker_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            workers[name] = Worker(name, ns, process, log_path)
        _wait_ready(list(workers.values()))
        yield Cluster(workers, redis.port, env["AGENT_DATABASE_URL"], effects)


def _wait_ready(workers: list[Worker]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    pending = list(workers)
    with httpx.Client(timeout=2.0) as client:
        while pending:
            worker = pending[0]
            if worker.process.poll() is not None:
                raise RuntimeError(f"worker {worker.name} exited:\n{worker.log_path.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{worker.base_url}/readyz").status_code == 200:
                    pending.pop(0)
                    continue
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {worker.name} not ready:\n{worker.log_path.read_text()}"
                )
            time.sleep(0.1)


@dataclass
class Watch:
    """An SSE response read line by line, each line with the time it arrived."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    headers: httpx.Headers | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self, client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> None:
        try:
            async with client.stream(method, url, **kw) as response:
                assert response.status_code == 200, response.status_code
                self.headers = response.headers
                async for line in response.aiter_lines():
                    self.lines.append((time.monotonic(), line))
        except httpx.HTTPError:
            pass  # cut off (the link-down variant): ended without a terminal event
        finally:
            self.ended.set()

    def events(self) -> list[str]:
        return [line[7:] for _, line in self.lines if line.startswith("event: ")]

    def data(self) -> list[dict[str, Any]]:
        return [json.loads(line[6:]) for _, line in self.lines if line.startswith("data: ")]

    def gaps(self, start: float, end: float) -> list[float]:
        """The silences between the lines received in [start, end] (blank lines aside)."""
        times = [start] + [t for t, line in self.lines if line and start <= t <= end]
        return [b - a for a, b in itertools.pairwise(times)]


async def _until(check: Any, within: float = 30.0, every: float = 0.1) -> Any:
    """Poll an async ``check`` until it returns something truthy (a safety net bounds it)."""
    async with asyncio.timeout(within):
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(every)


async def _waiting_run(
    client: httpx.AsyncClient, session: str, text: str
) -> tuple[Watch, str, str]:
    """A streamed run on ``client``'s worker waiting for the approval of ``append_line``."""
    watch = Watch()
    asyncio.get_running_loop().create_task(
        watch.follow(
            client, "POST", f"/v1/sessions/{session}/runs", json={"input": f"append {text}"}
        )
    )

    async def asked() -> dict[str, Any] | None:
        for data in watch.data():
            if data["type"] == "custom" and data["data"]["name"] == "confirmation_requested":
                return data
        assert not watch.ended.is_set(), watch.lines
        return None

    request = await _until(asked)
    return watch, request["run_id"], request["data"]["payload"]["tool_call_id"]


async def _failed_as_lost(client: httpx.AsyncClient, run_id: str) -> dict[str, Any] | None:
    view = (await client.get(f"/v1/runs/{run_id}")).json()
    return view if view["status"] == "failed" else None


async def _approve(
    client: httpx.AsyncClient, session: str, run_id: str, call: str
) -> httpx.Response:
    return await client.post(
        "/external-events",
        json={
            "session_id": session,
            "run_id": run_id,
            "name": "confirmation_response",
            "payload": {"tool_call_id": call, "approved": True},
        },
    )


async def _check_agreement(cluster: Cluster, session: str, lost: str) -> None:
    """The lost run's end is the same in PostgreSQL and in its event log, and the session's
    stored messages are those of its completed run only."""
    b = cluster.workers["B"]
    async with b.client() as client:
        view = (await client.get(f"/v1/runs/{lost}")).json()
        assert view["status"] == "failed" and view["error"]["code"] == "worker_lost", view
        events = Watch()
        await events.follow(client, "GET", f"/v1/runs/{lost}/events")
        terminal = events.data()[-1]
        assert terminal["type"] == "run.failed", events.events()
        assert terminal["data"]["error"]["code"] == "worker_lost"
        assert "tool.call.completed" not in events.events()
    db = await asyncpg.connect(cluster.database_url)
    try:
        status = await db.fetchval("SELECT status FROM runs WHERE run_id = $1", lost)
        stored = await db.fetch(
            "SELECT DISTINCT m.run_id, r.status FROM messages m JOIN runs r USING (run_id)"
            " WHERE m.session_id = $1",
            session,
        )
    finally:
        await db.close()
    assert status == "failed"
    assert lost not in {row["run_id"] for row in stored}
    assert {row["status"] for row in stored} <= {"completed"}, stored


def _effects(cluster: Cluster) -> list[str]:
    if not cluster.effects.exists():
        return []
    return cluster.effects.read_text(encoding="utf-8").splitlines()


async def _idle(worker: Worker) -> None:
    async with worker.client() as client:

        async def idle() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                state = (await client.get("/debug/state")).json()
                return bool(state["runs"] == 0)
            return False

        await _until(idle, within=60)


async def test_a_worker_cut_off_from_redis_stops_acting_for_its_runs(cluster: Cluster) -> None:
    a, b = cluster.workers["A"], cluster.workers["B"]
    session = f"fence-cut-{secrets.token_hex(4)}"
    followed = f"fence-far-{secrets.token_hex(4)}"
    rule = (
        "OUTPUT",
        "-d",
        a.ns.host_ip,
        "-p",
        "tcp",
        "--dport",
        str(cluster.redis_port),
        "-j",
        "DROP",
    )
    async with a.client() as ca, b.client() as cb:
        watch, run_id, call = await _waiting_run(ca, session, "one")
        # a run held by B, followed on A: its stream must keep its pings without Redis
        far = await cb.post(
            f"/v1/sessions/{followed}/runs", json={"input": "endless", "background": True}
        )
        assert far.status_code == 202, far.text
        far_id = far.json()["run_id"]
        remote = Watch()
        asyncio.get_running_loop().create_task(
            remote.follow(ca, "GET", f"/v1/runs/{far_id}/events")
        )
        await _until(lambda: _true(len(remote.events()) >= 2))

        cut = time.monotonic()
        a.ns.run("iptables", "-A", *rule)
        try:
            # A's own answers about the run while B's sweep takes it over
            answers: list[tuple[float, int, str | None]] = []

            async def poll_a() -> None:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        response = await ca.get(f"/v1/runs/{run_id}")
                        status = (
                            response.json().get("status") if response.status_code == 200 else None
                        )
                        answers.append((time.monotonic(), response.status_code, status))
                    await asyncio.sleep(0.1)

            poller = asyncio.get_running_loop().create_task(poll_a())
            lost = await _until(lambda: _failed_as_lost(cb, run_id))
            failed_after = time.monotonic() - cut
            assert lost["error"]["code"] == "worker_lost"
            # the late approval, on A: never 202
            late = await _approve(ca, session, run_id, call)
            assert late.status_code in (409, 503), late.text
            # ... nor on B, which does not hold the run
            assert (await _approve(cb, session, run_id, call)).status_code == 409

            # the session goes on, on B: at once, or (when A wrote the run's end itself,
            # under its lease's token) once A's lease has lapsed in Redis
            async def next_turn() -> httpx.Response | None:
                after = await cb.post(
                    f"/v1/sessions/{session}/runs", json={"input": "hello", "stream": False}
                )
                if after.status_code == 409 and after.json()["code"] == "session_busy":
                    assert after.json()["active_run_id"] == run_id, after.text
                    return None
                return after

            after = await _until(next_turn, within=TTL + 2)
            assert after.status_code == 200 and after.json()["status"] == "completed", after.text
            # the stream of A's run ended without a terminal event
            await asyncio.wait_for(watch.ended.wait(), 30)
            assert not {"run.completed", "run.failed", "run.cancelled"} & set(watch.events())
            # the followed stream on A kept its pings while Redis was out of reach
            await _until(lambda: _true(time.monotonic() > cut + 8 or remote.ended.is_set()))
            end = min(cut + 8, remote.lines[-1][0] if remote.ended.is_set() else cut + 8)
            gaps = remote.gaps(cut, end)
            assert max(gaps) <= 3 * PING, gaps
            poller.cancel()
        finally:
            a.ns.run("iptables", "-D", *rule, check=False)
        # past the lease deadline, A never said the run was live
        live_past = [
            (round(t - cut, 2), code, status)
            for t, code, status in answers
            if t > cut + DEADLINE + 0.5 and status in ("queued", "running", "waiting")
        ]
        assert not live_past, live_past
        assert any(code == 503 or status == "failed" for _, code, status in answers)
        await _idle(a)
        assert [line for line in _effects(cluster) if line.startswith("A ")] == []
        await _check_agreement(cluster, session, run_id)
        metrics = (await ca.get("/metrics")).text
        assert _metric(metrics, "agent_runs_fenced_total") >= 1
        assert _metric(metrics, "agent_lease_renewals_failed_total") >= 1
        await cb.post(f"/v1/runs/{far_id}/cancel")
        print(
            f"iptables cut: B failed A's run {failed_after:.1f} s after the cut; ping gaps "
            f"on A up to {max(gaps):.2f} s (ping {PING} s)"
        )


async def test_a_worker_whose_link_goes_down_fences_its_run_during_the_outage(
    cluster: Cluster,
) -> None:
    a, b = cluster.workers["A"], cluster.workers["B"]
    session = f"fence-down-{secrets.token_hex(4)}"
    async with a.client() as ca, b.client() as cb:
        watch, run_id, call = await _waiting_run(ca, session, "two")
        down = time.monotonic()
        a.ns.run("ip", "link", "set", a.ns.ns_if, "down")
        try:
            lost = await _until(lambda: _failed_as_lost(cb, run_id))
            failed_after = time.monotonic() - down
            assert lost["error"]["code"] == "worker_lost"
            # well past A's deadline before the link comes back
            await _until(lambda: _true(time.monotonic() > down + DEADLINE + 3))
        finally:
            up = time.time()
            a.ns.run("ip", "link", "set", a.ns.ns_if, "up")
        await _idle(a)
        fenced = [
            entry
            for entry in a.log()
            if entry.get("run_id") == run_id and str(entry.get("msg", "")).startswith("fenced off")
        ]
        assert fenced, "A never fenced its run off"
        fenced_at = datetime.fromisoformat(fenced[0]["ts"].replace("Z", "+00:00")).timestamp()
        assert fenced_at < up, (fenced_at, up)  # during the outage, not once the link was back
        late = await _approve(ca, session, run_id, call)
        assert late.status_code in (409, 503), late.text
        assert not {"run.completed", "run.failed", "run.cancelled"} & set(watch.events())
        watch_task_done = await asyncio.wait_for(watch.ended.wait(), 30)
        assert watch_task_done
        assert [line for line in _effects(cluster) if line.startswith("A ")] == []
        await _check_agreement(cluster, session, run_id)
        print(
            f"link down: B failed A's run {failed_after:.1f} s after the link went down; "
            f"A fenced it off {up - fenced_at:.1f} s before the link came back"
        )


async def _true(value: bool) -> bool:
    return value


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def test_runs_on_a_worker_cut_off_from_redis_go_on_elsewhere(
    resuming_cluster: Cluster,
) -> None:
    """A partition with resume on: the streaming run on the cut-off worker completes on
    another, its readers there seeing one stream (seq rising by one, one ``run.resumed``, the
    whole text); the waiting run waits again elsewhere and takes its answer there. The cut-off
    worker writes no end for either, and its tool never runs."""
    cluster = resuming_cluster
    a, b = cluster.workers["A"], cluster.workers["B"]
    waiting_session = f"part-wait-{secrets.token_hex(4)}"
    streaming_session = f"part-stream-{secrets.token_hex(4)}"
    words = [f"w{index}" for index in range(100)]
    text = "stream " + " ".join(words)
    rule = ("OUTPUT", "-d", a.ns.host_ip, "-p", "tcp", "--dport", str(cluster.redis_port))
    async with a.client() as ca, b.client() as cb:
        _, waiting_id, call = await _waiting_run(ca, waiting_session, "three")
        started = await ca.post(
            f"/v1/sessions/{streaming_session}/runs", json={"input": text, "background": True}
        )
        assert started.status_code == 202, started.text
        streaming_id = started.json()["run_id"]
        # a reader on B, which keeps reaching Redis: one stream across the hand-over
        reader = Watch()
        asyncio.get_running_loop().create_task(
            reader.follow(cb, "GET", f"/v1/runs/{streaming_id}/events")
        )
        await _until(lambda: _true(reader.events().count("text.delta") >= 5))
        cut = time.monotonic()
        a.ns.run("iptables", "-A", *rule, "-j", "DROP")
        try:
            await asyncio.wait_for(reader.ended.wait(), 60)
            resumed_after = time.monotonic() - cut
            documents = reader.data()
            assert [d["seq"] for d in documents] == list(range(1, len(documents) + 1))
            types = [d["type"] for d in documents]
            assert types.count("run.resumed") == 1, types
            assert types[-1] == "run.completed", types
            assert sum(t in ("run.completed", "run.failed", "run.cancelled") for t in types) == 1
            output = documents[-1]["data"]["output"]["content"]
            assert output.split() == ["stream", *words]

            # the waiting run waits again elsewhere, and takes its answer there
            async def answered() -> bool:
                response = await _approve(cb, waiting_session, waiting_id, call)
                assert response.status_code in (202, 503), response.text
                return response.status_code == 202

            await _until(answered, within=60)
            view: dict[str, Any] = {}

            async def completed() -> bool:
                nonlocal view
                view = (await cb.get(f"/v1/runs/{waiting_id}")).json()
                return bool(view["status"] == "completed")

            await _until(completed, within=30)
            assert "three" in view["output"]["content"], view
        finally:
            a.ns.run("iptables", "-D", *rule, "-j", "DROP", check=False)
        await _idle(a)
        # A wrote no end for either: each ended once, where it was resumed
        for run_id in (streaming_id, waiting_id):
            mine = [
                entry
                for entry in a.log()
                if entry.get("run_id") == run_id and entry.get("msg") == "run finished"
            ]
            assert all(entry.get("code") != "unavailable" for entry in mine), mine
        effects = _effects(cluster)
        assert [line for line in effects if line.startswith("A ")] == []
        assert [line for line in effects if line.endswith(" three")] != []
        print(
            f"partition: the streaming run completed elsewhere {resumed_after:.1f} s after the cut"
        )
