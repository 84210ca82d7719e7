"""10. Hand-over at a deploy: SIGTERM to a worker holding many runs that wait for an approval.

Two workers share Redis and one SQLite file. ``runs`` runs are started on worker A and each
waits for a confirmation; then A gets SIGTERM while B is up. Measured from the signal:

- **time until all are parked**: A's log stamps the signal and each ``run handed over``; the
  last of them (A exits right after);
- **time until all are resumable elsewhere**: until B holds every one of them again, waiting
  for its answer (B's ``agent_runs_resumed_total``), i.e. until every approval can be given;
- **Redis memory per run**: the bench database's keys (``MEMORY USAGE`` of each) while the
  runs wait on A, and once they are parked with no worker up (B stopped the same way), over
  the database before any run, per run.

The answer to every run is then posted to B and each completes, so a hand-over that lost a
run shows here as well.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.outcome import Config, Outcome, Target
from bench.procs import Server, ServerFailed, agent_server
from bench.scenarios import _redis_ready

__all__ = ["scenario_handover"]


def _redis_bytes(url: str) -> int:
    """The bench database's size: the sum of ``MEMORY USAGE`` over its keys."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        total = 0
        for key in client.scan_iter(count=1000):
            total += int(client.memory_usage(key, samples=0) or 0)
        return total
    finally:
        client.close()


def _wait(check: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took (RuntimeError past ``within``)."""
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > within:
            raise RuntimeError(f"{what}: not reached within {within:g} s")
        time.sleep(0.02)
    return time.perf_counter() - started


def _metric(server: Server, name: str) -> float:
    with httpx.Client(trust_env=False, timeout=10) as client:
        text = client.get(f"{server.url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def _stamps(server: Server, message: str) -> list[float]:
    """The epoch seconds of the server's log lines whose ``msg`` is ``message``."""
    found = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == message:
            found.append(datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp())
    return found


def _start_waiting(server: Server, runs: int) -> list[tuple[str, str]]:
    """``runs`` background runs that each wait for a confirmation: (session, run id)."""

    def start(index: int) -> tuple[str, str]:
        session = f"handover-{index}"
        with httpx.Client(trust_env=False, timeout=60) as client:
            answer = client.post(
                f"{server.url}/v1/sessions/{session}/runs",
                json={"input": f"delete file{index}.md", "background": True},
            )
        answer.raise_for_status()
        return session, str(answer.json()["run_id"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(start, range(runs)))


def _all_waiting(server: Server, runs: int) -> Callable[[], bool]:
    def check() -> bool:
        with httpx.Client(trust_env=False, timeout=10) as client:
            state = client.get(f"{server.url}/debug/state").json()
        waiting = sum(v.get("pending", 0) for v in state.get("extensions", {}).values())
        return bool(waiting >= runs)

    return check


def _answer_all(server: Server, started: list[tuple[str, str]]) -> int:
    """Approve every run through ``server``; how many were accepted."""

    def answer(item: tuple[str, str]) -> bool:
        session, run_id = item
        with httpx.Client(trust_env=False, timeout=60) as client:
            call_id = _asked_call(client, server, run_id)
            response = client.post(
                f"{server.url}/external-events",
                json={
                    "session_id": session,
                    "run_id": run_id,
                    "name": "confirmation_response",
                    "payload": {"tool_call_id": call_id, "approved": True},
                },
            )
        return response.status_code == 202

    with ThreadPoolExecutor(max_workers=16) as pool:
        return sum(pool.map(answer, started))


def _asked_call(client: httpx.Client, server: Server, run_id: str) -> str | None:
    """The ``tool_call_id`` of the run's last confirmation request, from its log."""
    url = f"{server.url}/v1/runs/{run_id}/events"
    # the request is in the log already: the read times out only if it is not
    with client.stream("GET", url, timeout=httpx.Timeout(30, read=10)) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "confirmation_requested" in line:
                call_id: str = json.loads(line[5:])["data"]["payload"]["tool_call_id"]
                return call_id
    return None


def scenario_handover(cfg: Config) -> Outcome:
    """10. SIGTERM with many runs waiting for an approval: parked, then resumed elsewhere."""
    runs = cfg.pick(1000, 20)
    out = Outcome(10, f"Hand-over: SIGTERM with {runs:,} runs waiting for an approval")
    out.columns = [
        "runs",
        "all parked s",
        "all resumable elsewhere s",
        "worker exit s",
        "Redis bytes/run waiting",
        "Redis bytes/run parked",
        "completed after",
    ]
    problem = _redis_ready(cfg.redis_url)
    if problem is not None:
        out.notes.append(f"pending: {problem}")
        return out
    shared = Path(tempfile.mkdtemp(prefix="bench-handover-"))
    env = {
        "AGENT_REDIS_URL": cfg.redis_url,
        "AGENT_DATABASE_URL": f"sqlite:///{shared}/agent.db",
        "AGENT_MAX_CONCURRENT_RUNS": str(runs + 10),
        "AGENT_MAX_QUEUED_RUNS": str(runs + 10),
        "AGENT_LOG_LEVEL": "info",
    }
    raw: dict[str, Any] = {}
    servers: list[Server] = []
    try:
        empty = _redis_bytes(cfg.redis_url)
        a = agent_server("handover-a", env, timeout=120)
        servers.append(a)
        b = agent_server("handover-b", env, timeout=120)
        servers.append(b)
        started = _start_waiting(a, runs)
        _wait(_all_waiting(a, runs), 300, "every run waiting on A")
        waiting = _redis_bytes(cfg.redis_url)
        signalled = time.time()
        a.process.send_signal(signal.SIGTERM)
        with ThreadPoolExecutor(max_workers=1) as pool:
            exit_of_a = pool.submit(lambda: (a.process.wait(120), time.time())[1])
            resumed = _wait(
                lambda: _metric(b, "agent_runs_resumed_total") >= runs, 300, "B took every run"
            )
            exited = exit_of_a.result() - signalled
        (signal_at,) = _stamps(a, "signal received: draining before shutdown")[-1:]
        handed = _stamps(a, "run handed over")
        parked = max(handed) - signal_at if len(handed) >= runs else None
        # B stopped with no worker left: every run parked, none held; what Redis keeps then
        b.process.send_signal(signal.SIGTERM)
        b.process.wait(120)
        parked_bytes = _redis_bytes(cfg.redis_url)
        c = agent_server("handover-c", env, timeout=120)
        servers.append(c)
        _wait(_all_waiting(c, runs), 300, "every run waiting on C")
        accepted = _answer_all(c, started)
        raw = {
            "runs": runs,
            "parked_s": parked,
            "resumable_s": resumed,
            "exit_s": exited,
            "handed_over": len(handed),
            "redis_empty_bytes": empty,
            "redis_waiting_bytes": waiting,
            "redis_parked_bytes": parked_bytes,
            "answers_accepted": accepted,
        }

        def completed() -> bool:
            return _metric(c, "agent_runs_total") >= accepted

        _wait(completed, 300, "every answered run completed")
        raw["completed"] = int(_metric(c, "agent_runs_total"))
    except (ServerFailed, RuntimeError) as exc:
        out.notes.append(f"pending: {str(exc).strip()[-300:]}")
        out.raw = raw
        return out
    finally:
        for server in servers:
            server.stop(30)
        shutil.rmtree(shared, ignore_errors=True)
    per_waiting = (raw["redis_waiting_bytes"] - raw["redis_empty_bytes"]) / runs
    per_parked = (raw["redis_parked_bytes"] - raw["redis_empty_bytes"]) / runs
    out.rows.append(
        [
            runs,
            None if parked is None else round(parked, 3),
            round(resumed, 2),
            round(exited, 2),
            round(per_waiting),
            round(per_parked),
            raw["completed"],
        ]
    )
    out.targets.append(Target("runs completed after two hand-overs", raw["completed"], runs, ">="))
    out.targets.append(
        Target(
            "all parked after SIGTERM",
            parked,
            5.0,
            "<=",
            "s",
            note="a person's approval must not wait out the drain timeout",
        )
    )
    out.notes.append(
        "Each run waits for a confirmation of the demo model's delete tool. 'all resumable "
        "elsewhere' runs from the signal until worker B holds every run again, waiting (its "
        "sweep finds the parked runs; an answer posted meanwhile would resume its run at "
        "once). The Redis figures are the bench database's keys (MEMORY USAGE) over the "
        "empty database, per run; parked = after B was stopped too, no worker up. After the "
        "second hand-over every run is approved through a third worker and completes."
    )
    out.raw = raw
    return out
