"""``agent-server --workers 2``: a worker that dies is replaced, and the log says why."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil

from app.supervisor import replacement_reason
from tests.e2e.conftest import launch, wait_for


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
    finally:
        server.stop()


def test_the_reasons_name_what_happened() -> None:
    assert replacement_reason(3, answered=True, timeout=60) == "it exited with status 3"
    assert "SIGSEGV" in replacement_reason(-11, answered=True, timeout=60)
    assert "out-of-memory" not in replacement_reason(-11, answered=True, timeout=60)
    hung = replacement_reason(-9, answered=False, timeout=60)
    assert "health check within 60 s" in hung
