"""A real ``agent-server`` process on a free loopback port, and SSE helpers.

Each server runs in its own temporary directory (its SQLite file under ``./var/``) with the
environment given by the test; the fixture waits for ``/readyz`` and stops the process at
the end, showing its log if a test failed.

The contract suites (``test_server.py``, ``test_lifecycle.py``) run once per backend:
``default`` (SQLite, the in-process bus) and ``redis+postgres`` (the machine's Redis and
PostgreSQL, with a key prefix and a schema of the test's own, removed afterwards).
``AGENT_TEST_BACKENDS=default`` (or ``redis+postgres``) selects one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

AGENT_SERVER = Path(sys.executable).with_name("agent-server")
BACKENDS = ("default", "redis+postgres")
# the modules whose tests run on every backend
_ON_EVERY_BACKEND = frozenset({"test_server", "test_lifecycle"})
TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled"})
START_TIMEOUT = 120.0

# Idle connections are dropped here before the server closes them (AGENT_KEEP_ALIVE_TIMEOUT,
# 5 s): with equal timeouts a request may go out on a connection the server is closing
KEEPALIVE_EXPIRY = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """A running server process."""

    base_url: str
    process: subprocess.Popen[bytes]
    directory: Path
    log_path: Path

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        limits = httpx.Limits(
            max_connections=500, max_keepalive_connections=50, keepalive_expiry=KEEPALIVE_EXPIRY
        )
        return httpx.AsyncClient(base_url=self.base_url, timeout=30.0, limits=limits, **kwargs)


def launch(
    directory: Path,
    env: dict[str, str],
    *,
    workers: int = 1,
    preexec_fn: Callable[[], object] | None = None,
    until: Callable[[httpx.Response], bool] | None = None,
) -> Server:
    """Start ``agent-server`` in ``directory`` and wait until it is ready (``preexec_fn``
    runs in the child before it starts, e.g. to set resource limits; ``until``, a test of the
    ``/readyz`` answer, replaces "200")."""
    directory.mkdir(parents=True, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    base_env.update(
        {
            "AGENT_DEMO_TOKEN_DELAY": "0.001",
            "AGENT_DEMO_SLOW_SECONDS": "0.1",
            "AGENT_DEBUG_ENDPOINTS": "1",
            "AGENT_LOG_LEVEL": "info",
        }
    )
    base_env.update(env)
    for _ in range(3):
        port = free_port()
        log_path = directory / f"server-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(AGENT_SERVER), "--port", str(port), "--workers", str(workers)],
                cwd=directory,
                env=base_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        server = Server(f"http://127.0.0.1:{port}", process, directory, log_path)
        if _wait_ready(server, until):
            return server
        server.stop()
        if "already in use" not in server.log().lower():
            break
    raise RuntimeError(f"agent-server did not become ready:\n{server.log()}")


def _wait_ready(server: Server, until: Callable[[httpx.Response], bool] | None = None) -> bool:
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(base_url=server.base_url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False
            with contextlib.suppress(httpx.TransportError):
                answer = client.get("/readyz")
                if until(answer) if until is not None else answer.status_code == 200:
                    return True
            time.sleep(0.05)
    return False


Launch = Callable[..., Server]


def selected_backends() -> list[str]:
    """The backends to run the contract suites on (``AGENT_TEST_BACKENDS``, default all)."""
    chosen = [
        name.strip()
        for name in os.environ.get("AGENT_TEST_BACKENDS", ",".join(BACKENDS)).split(",")
        if name.strip()
    ]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown or not chosen:
        raise pytest.UsageError(f"AGENT_TEST_BACKENDS={chosen}: choose among {BACKENDS}")
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    if "backend" in metafunc.fixturenames and module in _ON_EVERY_BACKEND:
        metafunc.parametrize("backend", selected_backends(), indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of the servers a test starts: ``default`` unless parametrized."""
    name: str = getattr(request, "param", "default")
    return name


@contextlib.contextmanager
def backend_env(backend: str) -> Iterator[dict[str, str]]:
    """The environment selecting ``backend``, with a Redis prefix and a PostgreSQL schema of
    its own (removed afterwards) for ``redis+postgres``."""
    if backend == "default":
        yield {}
        return
    from tests.scale.services import shared_backend

    with shared_backend() as env:
        yield env


@pytest.fixture
def start_server(tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> Iterator[Launch]:
    """``start_server(env, workers=1, directory=None)``: a server for this test, stopped
    afterwards; ``directory`` reuses another server's files (a restart). All the servers of
    a test share its backend (their database, and Redis)."""
    servers: list[Server] = []
    with backend_env(backend) as shared:

        def start(
            env: dict[str, str] | None = None, *, workers: int = 1, directory: Path | None = None
        ) -> Server:
            where = directory or tmp_path / f"server-{len(servers)}"
            server = launch(where, {**shared, **(env or {})}, workers=workers)
            servers.append(server)
            return server

        yield start
        for server in servers:
            server.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for server in servers:
            print(f"--- {server.base_url} log ---\n{server.log()[-20000:]}")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[Server]:
    """One shared server per backend (tests use their own session ids)."""
    with backend_env(backend) as shared:
        running = launch(tmp_path_factory.mktemp("shared-server"), shared)
        yield running
        running.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@dataclass(frozen=True)
class Event:
    """One SSE event as received."""

    id: int
    type: str
    data: dict[str, Any]


def to_event(sse: Any) -> Event:
    data = json.loads(sse.data)
    assert isinstance(data, dict)
    return Event(int(sse.id), sse.event, data)


async def read_events(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    stop_after: int | None = None,
    **kwargs: Any,
) -> tuple[list[Event], httpx.Response]:
    """Read an SSE response to its end (or ``stop_after`` events, then close it)."""
    events: list[Event] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        response = source.response
        if response.status_code != 200:
            await response.aread()
            return events, response
        async for sse in source.aiter_sse():
            events.append(to_event(sse))
            if stop_after is not None and len(events) >= stop_after:
                break
    return events, response


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[Event]]]:
    """An SSE response and an iterator over its events; closed on exit."""
    async with aconnect_sse(client, method, url, **kwargs) as source:

        async def events() -> AsyncIterator[Event]:
            async for sse in source.aiter_sse():
                yield to_event(sse)

        yield source.response, events()


def assert_well_formed(events: list[Event], run_id: str) -> None:
    """Ids rise by one from 1, every event carries the run, one terminal and it is last."""
    assert events, "no events"
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    for event in events:
        assert event.data["seq"] == event.id
        assert event.data["type"] == event.type
        assert event.data["run_id"] == run_id
        assert event.data["ts"].endswith("Z")
        assert set(event.data) == {"type", "seq", "run_id", "session_id", "ts", "data"}
    assert [e.type in TERMINAL for e in events].count(True) == 1
    assert events[-1].type in TERMINAL


async def wait_for(check: Callable[[], Any], *, within: float = 20.0) -> Any:
    """Poll an async ``check`` until it returns something truthy; that value."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)
