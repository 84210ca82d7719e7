"""Scenarios with Redis as the bus.

8. One stream through a distant Redis: every Redis call goes through ``bench.delay_proxy``
adding 0, 5 or 50 ms to each round trip; this branch's code beside a baseline commit's.

For each delay and each code: time to the first ``text.delta`` and events/s of one stream
(sequential runs of the demo model, 20 ms between tokens), and the confirmation round trip
across two workers (started and followed on one, answered on the other).

The baseline is the commit named by ``BENCH_BASELINE_REF`` (say ``main``), run from a scratch
checkout of its tree with the same interpreter and packages; without it only this code runs.

9. Relay events/s of ``--workers 2`` against one worker, both on Redis, on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.outcome import Config, Outcome, Target
from bench.procs import HOST, ServerFailed, agent_server, checkout, delay_proxy, proxy_port
from bench.procs import run_loadgen as loadgen
from bench.scenarios import (
    _ratio,
    _redis_ready,
    _serving,
    relay_input,
    relay_spec,
)

__all__ = ["scenario_redis_latency", "scenario_workers"]

DELAYS_MS = (0.0, 5.0, 50.0)
TOKEN_GAP = 0.02
WORDS = 60


@contextlib.contextmanager
def _proxy(rtt_ms: float) -> Iterator[int]:
    process = delay_proxy(rtt_ms)
    try:
        yield proxy_port(process)
    finally:
        process.terminate()
        process.wait(10)


def _round_trip(port: int, db: str, samples: int = 40) -> float:
    """The median time of a PING through the proxy, ms: the round trip the servers meet."""
    import redis

    client = redis.Redis(host=HOST, port=port, db=int(db), socket_connect_timeout=5)
    try:
        client.ping()
        times = []
        for _ in range(samples):
            begun = time.perf_counter()
            client.ping()
            times.append((time.perf_counter() - begun) * 1000)
    finally:
        client.close()
    return statistics.median(times)


def _measure(cfg: Config, rtt_ms: float, source: Path | None, label: str) -> dict[str, Any]:
    """The stream timing and the cross-worker confirmation of one code at one delay."""
    problem = _redis_ready(cfg.redis_url)
    if problem is not None:
        return {"pending": problem}
    db = cfg.redis_url.rsplit("/", 1)[-1]
    result: dict[str, Any] = {}
    shared = Path(tempfile.mkdtemp(prefix="bench-redis-latency-"))
    try:
        with _proxy(rtt_ms) as port:
            result["redis_rtt_ms"] = _round_trip(port, db)
            env = {
                "AGENT_REDIS_URL": f"redis://{HOST}:{port}/{db}",
                "AGENT_DEMO_TOKEN_DELAY": str(TOKEN_GAP),
                "AGENT_DATABASE_URL": f"sqlite:///{shared}/agent.db",
            }
            name = f"rl-{label}-{rtt_ms:g}"
            with (
                _serving(agent_server(f"{name}-a", env, timeout=120, source=source)) as a,
                _serving(agent_server(f"{name}-b", env, timeout=120, source=source)) as b,
            ):
                result["stream"] = loadgen(
                    {
                        "task": "stream_timing",
                        "host": HOST,
                        "port": a.port,
                        "input": relay_input(WORDS),
                        "requests": cfg.pick(10, 2),
                        "warmup": cfg.pick(2, 1),
                        "time_limit": 240,
                    }
                )
                result["confirm"] = loadgen(
                    {
                        "task": "confirm",
                        "host": HOST,
                        "port": a.port,
                        "follow_port": a.port,
                        "answer_port": b.port,
                        "requests": cfg.pick(12, 2),
                        "warmup": cfg.pick(2, 1),
                        "time_limit": 240,
                    }
                )
    except ServerFailed as exc:
        result = {"pending": f"the server did not start: {exc}"}
    except RuntimeError as exc:
        result = {"pending": f"failed while measured: {str(exc).strip()[-300:]}"}
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return result


def scenario_redis_latency(cfg: Config) -> Outcome:
    """8. Time to first event, one stream's events/s and the answer across workers, with
    0 / 5 / 50 ms added to every Redis round trip."""
    out = Outcome(8, "Redis latency: one stream and an answer across workers, Redis farther away")
    out.columns = [
        "code",
        "added RTT ms",
        "measured RTT ms",
        "first event p50 ms",
        "first event p99 ms",
        "run s p50",
        "events/s",
        "answer → next event p50 ms",
    ]
    ref = os.environ.get("BENCH_BASELINE_REF")
    codes: list[tuple[str, Path | None]] = [("this", None)]
    folder: Path | None = None
    if ref:
        folder, commit = checkout(ref)
        codes.insert(0, (f"baseline {commit}", folder))
    raw: dict[str, Any] = {}
    try:
        # each delay with both codes in a row: a machine's load drifting over the scenario
        # weighs on both alike
        for rtt in DELAYS_MS:
            for label, source in codes:
                measured = _measure(cfg, rtt, source, label.split()[-1])
                raw[f"{label} {rtt:g}"] = measured
                if "pending" in measured:
                    out.rows.append([label, rtt, "", "pending", "", "", "", ""])
                    out.notes.append(f"{label} at +{rtt:g} ms: {measured['pending']}")
                    continue
                stream, confirm = measured["stream"], measured["confirm"]
                out.rows.append(
                    [
                        label,
                        rtt,
                        measured["redis_rtt_ms"],
                        stream["ttfe"]["p50"],
                        stream["ttfe"]["p99"],
                        stream["total"]["p50"] / 1000,
                        stream["events_per_s"],
                        confirm["round_trip"]["p50"],
                    ]
                )
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    this = {rtt: raw.get(f"this {rtt:g}", {}) for rtt in DELAYS_MS}
    near, far = this[DELAYS_MS[0]], this[DELAYS_MS[-1]]
    if "stream" in near and "stream" in far:
        rate = far["stream"]["events_per_s"] / near["stream"]["events_per_s"]
        out.targets.append(
            Target(f"events/s at +{DELAYS_MS[-1]:g} ms vs +0 ms", rate, 0.8, ">=", "x")
        )
        # in round trips as measured through the proxy (a PING), not as asked of it: the
        # proxy's own timing is the instrument's error, not the service's
        added = far["stream"]["ttfe"]["p50"] - near["stream"]["ttfe"]["p50"]
        trip = far["redis_rtt_ms"] - near["redis_rtt_ms"]
        out.targets.append(
            Target(
                f"first event p50 added at +{DELAYS_MS[-1]:g} ms, in round trips",
                added / trip,
                2.0,
                "<=",
                "RTT",
            )
        )
    out.notes.append(
        f"Two workers share Redis (db {cfg.redis_url.rsplit('/', 1)[-1]}) and one SQLite file; "
        "every Redis connection goes through bench/delay_proxy.py, which holds each chunk for "
        "half the added round trip in each direction (measured RTT: the median PING through "
        "it; the first event's round trips are counted in measured ones). One stream: "
        f"sequential runs of the demo model ({WORDS} words, {TOKEN_GAP * 1000:g} ms apart) "
        "started and read on worker A; "
        "events/s = frames / time from the POST to the stream's end. Answer → next event: "
        "POST /external-events on worker B to tool.call.completed on A's stream."
    )
    out.raw = raw
    return out


def scenario_workers(cfg: Config) -> Outcome:
    """9. Relay events/s with Redis: ``--workers 2`` against one worker, same machine."""
    words = cfg.pick(2000, 200)
    levels: list[tuple[int, int]] = cfg.pick([(10, 8), (100, 2)], [(10, 1)])
    body = json.dumps({"input": relay_input(words)})
    out = Outcome(9, "Two workers: relay events/s with Redis, --workers 2 vs one worker")
    out.columns = ["code", "clients", "1 worker ev/s", "2 workers ev/s", "ratio", "CPU% (1 / 2)"]
    problem = _redis_ready(cfg.redis_url)
    if problem is not None:
        out.notes.append(f"pending — {problem}")
        return out
    ref = os.environ.get("BENCH_BASELINE_REF")
    codes: list[tuple[str, Path | None]] = [("this", None)]
    if ref:
        folder, commit = checkout(ref)
        codes.insert(0, (f"baseline {commit}", folder))
    raw: dict[str, Any] = {}
    try:
        for label, source in codes:
            raw[label] = _workers(cfg, levels, body, source, label.split()[-1])
    finally:
        for _, source in codes:
            if source is not None:
                shutil.rmtree(source, ignore_errors=True)
    for label, _ in codes:
        _worker_rows(out, label, levels, raw[label])
    out.notes.append(
        f"{words} words per run, the demo model without delay; both servers use Redis (db "
        f"{cfg.redis_url.rsplit('/', 1)[-1]}) as their bus. The machine has "
        f"{os.cpu_count()} cores, shared by the workers, Redis and the load generator: CPU% is "
        "the server's processes' (100 = one core)."
    )
    out.raw = raw
    return out


def _workers(
    cfg: Config, levels: list[tuple[int, int]], body: str, source: Path | None, label: str
) -> dict[str, dict[int, dict[str, Any]]]:
    results: dict[str, dict[int, dict[str, Any]]] = {"1": {}, "2": {}}
    env = {"AGENT_REDIS_URL": cfg.redis_url}
    for workers in (1, 2):
        name = f"workers-{label}-{workers}"
        server = agent_server(name, env, workers=workers, timeout=120, source=source)
        with _serving(server):
            for concurrency, runs in levels:
                results[str(workers)][concurrency] = loadgen(
                    relay_spec(
                        server,
                        "",
                        concurrency,
                        runs,
                        path="/v1/sessions/{n}/runs",
                        body=body,
                        ok="event: run.completed",
                    )
                )
    return results


def _worker_rows(
    out: Outcome,
    label: str,
    levels: list[tuple[int, int]],
    results: dict[str, dict[int, dict[str, Any]]],
) -> None:
    for concurrency, _ in levels:
        one, two = results["1"][concurrency], results["2"][concurrency]
        ratio = _ratio(two["events_per_s"], one["events_per_s"])
        out.rows.append(
            [
                label,
                concurrency,
                round(one["events_per_s"]),
                round(two["events_per_s"]),
                ratio,
                f"{one['server_cpu_pct']:.0f} / {two['server_cpu_pct']:.0f}",
            ]
        )
        if label == "this":
            out.targets.append(
                Target(
                    f"{concurrency} clients: 2 workers / 1 worker events/s", ratio, 1.6, ">=", "x"
                )
            )
        for name, result in (("1 worker", one), ("2 workers", two)):
            if result["ok"] != result["runs"] or result["errors"]:
                refused = result.get("refused") or {}
                out.notes.append(
                    f"{label}, {name}, {concurrency} clients: {result['runs'] - result['ok']} "
                    f"runs without run.completed, {result['errors']} errors (refused by "
                    f"status: {refused})"
                )
