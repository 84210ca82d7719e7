"""A real ``agent-server`` process on a free loopback port, in a directory of its own.

Each server runs in its own temporary directory (its SQLite file under ``./var/``) with the
environment given by the test; ``launch`` waits for ``/readyz``. ``backend_env`` gives the
environment of a backend: ``default`` (SQLite, the in-process bus) or ``redis+postgres`` (the
machine's Redis and PostgreSQL, with a key prefix and a schema of the test's own, removed
afterwards); ``AGENT_TEST_BACKENDS`` selects the backends the contract suites run on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.services import shared_backend

AGENT_SERVER = Path(sys.executable).with_name("agent-server")
BACKENDS = ("default", "redis+postgres")
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


@contextlib.contextmanager
def backend_env(backend: str) -> Iterator[dict[str, str]]:
    """The environment selecting ``backend``, with a Redis prefix and a PostgreSQL schema of
    its own (removed afterwards) for ``redis+postgres``."""
    if backend == "default":
        yield {}
        return
    with shared_backend() as env:
        yield env


def stop(server: Server, request: pytest.FixtureRequest, failed_before: int) -> None:
    """Stop a module's server; print its log's tail if a test failed while it served."""
    server.stop()
    if request.session.testsfailed > failed_before:
        print(f"--- {server.base_url} log (tail) ---\n{server.log()[-20000:]}")
