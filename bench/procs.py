"""Processes the harness starts: the servers it measures, their baselines, the load generator.

Every server listens on 127.0.0.1 at a free port, runs in a scratch directory of its own
(its SQLite file, its log), and is stopped by its own pid when the scenario ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

__all__ = [
    "ROOT",
    "Server",
    "ServerFailed",
    "agent_server",
    "free_port",
    "run_loadgen",
    "start_server",
]

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class ServerFailed(RuntimeError):
    """A server did not become ready; ``log`` is the end of its output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A started server process."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    profiler: subprocess.Popen[bytes] | None = None
    cleanup: list[Path] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status. Removes its scratch files."""
        if self.profiler is not None and self.profiler.poll() is None:
            self.profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.profiler.wait(30)
            except subprocess.TimeoutExpired:
                self.profiler.kill()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if not os.environ.get("BENCH_KEEP"):
            for path in [self.workdir, *self.cleanup]:
                shutil.rmtree(path, ignore_errors=True)
        return self.process.returncode

    def profile(self) -> None:
        """With ``BENCH_PYSPY=/path/to/py-spy``: record this server until it stops.

        The flame graph goes to ``bench/results/profiles/<name>.svg``.
        """
        pyspy = os.environ.get("BENCH_PYSPY")
        if not pyspy:
            return
        out = ROOT / "bench" / "results" / "profiles"
        out.mkdir(parents=True, exist_ok=True)
        # BENCH_PYSPY_FORMAT=raw writes collapsed stacks (text) instead of a flame graph
        kind = os.environ.get("BENCH_PYSPY_FORMAT", "flamegraph")
        suffix = "txt" if kind == "raw" else "svg"
        self.profiler = subprocess.Popen(
            [
                pyspy,
                "record",
                "--pid",
                str(self.pid),
                "--rate",
                "500",
                "--subprocesses",
                "--format",
                kind,
                "--output",
                str(out / f"{self.name}.{suffix}"),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _wait_ready(server: Server, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = server.log_tail(200)
                server.stop()
                raise ServerFailed(
                    f"{server.name} exited with status {server.process.returncode}", log
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}{path}").status_code == 200:
                    return
            time.sleep(0.1)
    log = server.log_tail()
    server.stop(5)
    raise ServerFailed(f"{server.name} was not ready within {timeout:g} s", log)


def start_server(
    name: str,
    command: Sequence[str],
    *,
    port: int,
    env: Mapping[str, str] | None = None,
    ready_path: str = "/readyz",
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> Server:
    """Start ``command`` (which must listen on ``port``) and wait for ``ready_path``."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    log_path = workdir / "server.log"
    full_env = {**os.environ, **(env or {})}
    # the load must never leave the machine: no proxies for loopback calls
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        full_env.pop(key, None)
    full_env["NO_PROXY"] = "127.0.0.1,localhost"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(command),
            cwd=cwd or workdir,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = Server(name, process, port, workdir, log_path, dict(env or {}))
    _wait_ready(server, ready_path, timeout)
    server.profile()
    return server


def agent_server(
    name: str,
    env: Mapping[str, str] | None = None,
    *,
    workers: int = 1,
    port: int | None = None,
    timeout: float = 60.0,
    source: Path | None = None,
) -> Server:
    """``agent-server`` (``python -m app.cli``) with a scratch SQLite file and ``env``.

    ``source``: a checkout whose ``app`` and ``agent_runtime`` run instead of this one's (a
    baseline of an earlier commit, see ``checkout``)."""
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-db-"))
    settings = {
        "AGENT_DEMO_TOKEN_DELAY": "0",
        "AGENT_DATABASE_URL": f"sqlite:///{workdir}/agent.db",
        "AGENT_DEBUG_ENDPOINTS": "1",
        **(env or {}),
    }
    if source is not None:
        settings["PYTHONPATH"] = str(source)
    module = "app.cli"
    if os.environ.get("BENCH_TRACE"):
        # the same server with timers around its critical path (bench/trace_server.py)
        module = "bench.trace_server"
        traces = ROOT / "bench" / "results" / "profiles"
        traces.mkdir(parents=True, exist_ok=True)
        settings["BENCH_TRACE_OUT"] = str(traces / f"{name}-trace.json")
    command = [sys.executable, "-m", module, "--port", str(port), "--workers", str(workers)]
    try:
        server = start_server(
            name, command, port=port, env=settings, timeout=timeout, cwd=source or ROOT
        )
    except ServerFailed:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    server.cleanup.append(workdir)
    return server


def checkout(ref: str) -> tuple[Path, str]:
    """The tree of commit ``ref`` in a scratch folder (remove it when done), and its hash."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix=f"bench-src-{commit}-"))
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder, commit


def delay_proxy(rtt_ms: float, target: str = "127.0.0.1:6379") -> subprocess.Popen[bytes]:
    """``bench.delay_proxy`` in its own process, adding ``rtt_ms`` to each round trip through
    it; read its port from ``proxy_port``."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.delay_proxy", "--target", target, "--rtt-ms", str(rtt_ms)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def proxy_port(process: subprocess.Popen[bytes]) -> int:
    """The port a ``delay_proxy`` process listens on (its first line)."""
    assert process.stdout is not None
    line = process.stdout.readline().decode(errors="replace")
    if not line.startswith("listening "):
        process.kill()
        raise ServerFailed("the delay proxy did not start", line)
    return int(line.split()[1])


def baseline_server(
    name: str,
    frames_path: Path | None = None,
    *,
    gap: float = 0.0,
    app: str = "bench.baseline_sse:app",
) -> Server:
    """The minimal sse-starlette app (``bench.baseline_sse``) on the same uvicorn stack, or
    another floor app (``bench.baseline_raw:app``); ``gap``: seconds between frames."""
    port = free_port()
    env = {"BENCH_FRAMES": str(frames_path)} if frames_path is not None else {}
    if gap:
        env["BENCH_FRAME_GAP"] = str(gap)
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return start_server(name, command, port=port, env=env, cwd=ROOT)


def run_loadgen(spec: Mapping[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Run one load generator task in its own process; its JSON answer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env.pop(key, None)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.loadgen"],
        input=json.dumps(spec).encode(),
        capture_output=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"the load generator failed ({spec.get('task')}): "
            f"{completed.stderr.decode(errors='replace')[-1500:]}"
        )
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


@contextlib.contextmanager
def running(server: Server, stop_timeout: float = 30.0) -> Iterator[Server]:
    """Stop ``server`` when the block ends."""
    try:
        yield server
    finally:
        server.stop(stop_timeout)


def rss(pid: int) -> int:
    """RSS of ``pid`` and its children."""
    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total
