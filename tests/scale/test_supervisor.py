"""``agent-server --workers 2``: each worker accepts on a socket of its own, so connections
spread over the workers; a worker that dies is replaced on its socket, and the log says why."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from app.server.supervisor import replacement_reason
from tests.support.server import AGENT_SERVER, Server, launch
from tests.support.waiting import wait_for

# connections opened at once: all on one of two workers by chance once in 2**15
BURST = 16


def _listening_sockets(port: int) -> int:
    """How many sockets listen on ``port`` (each once, whichever processes hold it)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    fields = [line.split() for line in lines]
    return sum(1 for f in fields if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port)


async def _connections_per_worker(server: Server, workers: list[psutil.Process]) -> list[int]:
    """Once every worker listens, open ``BURST`` connections at once, each with one request
    answered, and count the ones each worker holds."""
    port = server.port

    async def listening() -> bool:
        return _listening_sockets(port) == len(workers)

    # the server is ready once one worker is; a worker still starting has no socket yet
    await wait_for(listening, within=60)
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connect() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append((reader, writer))
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")

    try:
        await asyncio.gather(*(connect() for _ in range(BURST)))
        ports = {writer.get_extra_info("sockname")[1] for _, writer in opened}
        return [
            sum(
                1
                for c in worker.net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port in ports
            )
            for worker in workers
        ]
    finally:
        for _, writer in opened:
            writer.close()


def _workers(supervisor: psutil.Process) -> list[psutil.Process]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    return [child for child in supervisor.children() if "spawn_main" in " ".join(child.cmdline())]


def _replacements(log: str) -> list[dict[str, object]]:
    lines = [line for line in log.splitlines() if line.startswith("{")]
    return [entry for entry in map(json.loads, lines) if entry.get("msg") == "worker replaced"]


async def test_a_killed_worker_is_replaced_and_the_log_says_why(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    server = launch(tmp_path, cluster_env, workers=2)
    try:
        supervisor = psutil.Process(server.process.pid)
        workers = _workers(supervisor)
        assert len(workers) == 2
        victim = workers[0].pid
        workers[0].send_signal(signal.SIGKILL)

        async def replaced() -> list[dict[str, object]]:
            return _replacements(server.log())

        (entry,) = await wait_for(replaced, within=60)
        assert entry["pid"] == victim
        assert entry["reason"] == replacement_reason(-9, answered=True, timeout=60)
        assert "SIGKILL" in str(entry["reason"])
        assert entry["replacement_pid"] in {child.pid for child in _workers(supervisor)}
        async with server.client() as client:
            assert (await client.get("/healthz")).status_code == 200
        # the replacement listens on a socket of its own, and takes its share
        counts = await _connections_per_worker(server, _workers(supervisor))
        assert sum(counts) == BURST and all(counts), counts
    finally:
        server.stop()


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="Linux's SO_REUSEPORT")
async def test_connections_spread_over_the_workers(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    server = launch(tmp_path, cluster_env, workers=2)
    try:
        workers = _workers(psutil.Process(server.process.pid))
        assert len(workers) == 2
        # opened in one burst: with one shared socket, the worker awake first took them all
        counts = await _connections_per_worker(server, workers)
        assert sum(counts) == BURST and all(counts), counts
    finally:
        server.stop()


async def test_a_second_server_on_a_port_in_use_does_not_start(
    tmp_path: Path, cluster_env: dict[str, str]
) -> None:
    server = launch(tmp_path / "first", cluster_env, workers=2)
    try:
        port = str(server.port)

        async def both_listen() -> bool:
            return _listening_sockets(server.port) == 2

        # the server is ready once one worker is; the other may still be starting
        await wait_for(both_listen, within=60)
        second = await asyncio.to_thread(
            subprocess.run,
            [str(AGENT_SERVER), "--port", port, "--workers", "2"],
            env={**cluster_env, "PATH": "/usr/bin:/bin"},
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2
        assert second.stderr.decode().splitlines()[-1] == (
            f"agent-server: cannot start: 127.0.0.1:{port} is already in use (another process "
            "listens on it: stop that one, or choose another --port)"
        )
        # the first server still has its two sockets, and nobody joined them
        assert _listening_sockets(int(port)) == 2
    finally:
        server.stop()


def test_the_reasons_name_what_happened() -> None:
    assert replacement_reason(3, answered=True, timeout=60) == "it exited with status 3"
    assert "SIGSEGV" in replacement_reason(-11, answered=True, timeout=60)
    assert "out-of-memory" not in replacement_reason(-11, answered=True, timeout=60)
    hung = replacement_reason(-9, answered=False, timeout=60)
    assert "health check within 60 s" in hung
