"""14. Cost per event and per run: the server CPU one event costs when each event is its own
write, on the in-process bus and on Redis, beside an sse-starlette relay and a raw ASGI relay
of the same frames at the same pace; and the server CPU of a one-word run.

Every case streams the demo model's answer with ``GAP`` seconds between tokens, so each event
leaves the server as its own write (a model streaming one token at a time, as most do), from
80 concurrent clients (300-token runs). The figure is the server's process-tree CPU over the window
divided by the events the clients received; with Redis, Redis's own CPU (``INFO cpu``) over
the same window is reported beside it. The cases alternate, ``rounds`` times, and the table
shows each one's median, so the machine's other work weighs on all of them alike.

The one-word runs are measured twice on the service: each in a new session (what a run costs
at the least), and as the turns of one conversation per client (60 turns: each run reads the
conversation so far first, as a chat's runs do).

With ``BENCH_BASELINE_REF`` (say ``main``) the service cases run a second time from that
commit's tree, in the same rounds: the before and after of a change, side by side.
``BENCH_ROUNDS`` sets the number of rounds (3; 1 in the quick run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench.outcome import Config, Outcome, Target
from bench.procs import Server, agent_server, baseline_server, checkout, run_loadgen
from bench.scenarios import _capture_frames, _redis_ready, relay_input, relay_spec

__all__ = ["scenario_event_cost"]

GAP = 0.02
"""Seconds between two tokens of the demo model (and two frames of the floors): the demo's
default pace, a model streaming 50 tokens a second."""

Case = tuple[str, Callable[[], Server]]


def _cpu_us(result: dict[str, Any], per: str) -> float | None:
    """Server CPU µs per frame (``per="event"``) or per run (``per="run"``)."""
    count = result.get("frames" if per == "event" else "runs") or 0
    if not count or result.get("errors") or result.get("ok") != result.get("runs"):
        return None
    cpu_s = float(result["server_cpu_pct"]) / 100 * float(result["wall_s"])
    return 1e6 * cpu_s / count


def _redis_cpu(url: str) -> float:
    """Redis's CPU seconds so far (user + system, all its threads)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        info: dict[str, Any] = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


@contextlib.contextmanager
def _servers(cases: list[Case]) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        for name, start in cases:
            started[name] = start()
        yield started
    finally:
        for server in started.values():
            server.stop(30)


def _measure(
    servers: dict[str, Server],
    rounds: int,
    body: str,
    clients: int,
    runs: int,
    per: str,
    redis_url: str | None,
    path: str = "/v1/sessions/{n}/runs",
) -> dict[str, dict[str, Any]]:
    """Every server ``rounds`` times in turn: the CPU figures of each round, and Redis's."""
    results: dict[str, dict[str, Any]] = {
        name: {"cpu_us": [], "redis_us": [], "raw": []} for name in servers
    }
    for _ in range(rounds):
        for name, server in servers.items():
            spec = relay_spec(
                server,
                "",
                clients,
                runs,
                path=path,
                body=body,
                ok="event: run.completed",
            )
            on_redis = redis_url is not None and "Redis" in name
            before = _redis_cpu(redis_url) if on_redis and redis_url else 0.0
            result = run_loadgen(spec)
            entry = results[name]
            entry["raw"].append(result)
            entry["cpu_us"].append(_cpu_us(result, per))
            if on_redis and redis_url and result.get("frames"):
                count = result["frames"] if per == "event" else result["runs"]
                entry["redis_us"].append(1e6 * (_redis_cpu(redis_url) - before) / count)
    return results


def scenario_event_cost(cfg: Config) -> Outcome:
    """14. Server CPU per event (one write each) and per one-word run, beside the floors."""
    # long runs, so that what a run costs once weighs little on its events' figure (the
    # one-word runs measure that part)
    words = cfg.pick(300, 30)
    clients = cfg.pick(80, 4)
    runs = 1
    # more rounds where the machine's neighbours make one round's figures wander
    rounds = int(os.environ.get("BENCH_ROUNDS") or cfg.pick(3, 1))
    word_clients, word_runs = cfg.pick((10, 60), (2, 5))
    out = Outcome(14, "Cost per event (one write each) and per one-word run")
    out.columns = [
        "case",
        "server µs per event",
        "Redis µs per event",
        "µs per one-word run",
        "µs per one-word turn",
    ]
    redis_problem = _redis_ready(cfg.redis_url)
    redis_url = None if redis_problem else cfg.redis_url
    ref = os.environ.get("BENCH_BASELINE_REF")
    sources: list[tuple[str, Path | None]] = [("this tree", None)]
    if ref:
        folder, commit = checkout(ref)
        sources.append((f"baseline {commit}", folder))
    frames_dir = cfg.results_dir / "event-cost"
    paced_frames = frames_dir / "paced.json"
    word_frames = frames_dir / "one-word.json"
    paced_body = json.dumps({"input": relay_input(words)})
    word_body = json.dumps({"input": relay_input(1)})
    raw: dict[str, Any] = {"words": words, "clients": clients, "gap_s": GAP}
    try:
        paced: list[Case] = []
        single: list[Case] = []
        for label, source in sources:
            tag = label.split()[-1]
            local_env = {"AGENT_DEMO_TOKEN_DELAY": str(GAP)}
            paced.append(
                (
                    f"service, in-process bus ({label})",
                    partial(agent_server, f"cost-{tag}", local_env, source=source),
                )
            )
            if redis_url is not None:
                redis_env = {**local_env, "AGENT_REDIS_URL": redis_url}
                paced.append(
                    (
                        f"service, Redis bus ({label})",
                        partial(agent_server, f"cost-redis-{tag}", redis_env, source=source),
                    )
                )
            single.append(
                (
                    f"service, in-process bus ({label})",
                    partial(agent_server, f"word-{tag}", source=source),
                )
            )
        # the floors replay the frames of one real run of this tree
        with _servers(paced[:1]) as first:
            _capture_frames(next(iter(first.values())), relay_input(words), paced_frames)
            _capture_frames(next(iter(first.values())), relay_input(1), word_frames)
        paced += [
            ("sse-starlette relay", lambda: baseline_server("cost-sse", paced_frames, gap=GAP)),
            (
                "raw ASGI relay",
                lambda: baseline_server(
                    "cost-raw", paced_frames, gap=GAP, app="bench.baseline_raw:app"
                ),
            ),
        ]
        single += [
            ("sse-starlette relay", lambda: baseline_server("word-sse", word_frames)),
            (
                "raw ASGI relay",
                lambda: baseline_server("word-raw", word_frames, app="bench.baseline_raw:app"),
            ),
        ]
        with _servers(paced) as servers:
            per_event = _measure(servers, rounds, paced_body, clients, runs, "event", redis_url)
        with _servers(single) as servers:
            per_run = _measure(servers, rounds, word_body, word_clients, word_runs, "run", None)
            # the same servers again, each client's runs the turns of one conversation
            services = {name: server for name, server in servers.items() if "service" in name}
            per_turn = _measure(
                services,
                rounds,
                word_body,
                word_clients,
                word_runs,
                "run",
                None,
                path="/v1/sessions/{client}/runs",
            )
    finally:
        for _, source in sources:
            if source is not None:
                shutil.rmtree(source, ignore_errors=True)
    event_us = {name: _median(entry["cpu_us"]) for name, entry in per_event.items()}
    redis_us = {name: _median(entry["redis_us"]) for name, entry in per_event.items()}
    run_us = {name: _median(entry["cpu_us"]) for name, entry in per_run.items()}
    turn_us = {name: _median(entry["cpu_us"]) for name, entry in per_turn.items()}
    for name in dict.fromkeys([*per_event, *per_run]):
        out.rows.append(
            [
                name,
                _fmt(event_us.get(name)),
                _fmt(redis_us.get(name)),
                _fmt(run_us.get(name)),
                _fmt(turn_us.get(name)),
            ]
        )
    this = "(this tree)"
    local = event_us.get(f"service, in-process bus {this}")
    shared = event_us.get(f"service, Redis bus {this}")
    sse = event_us.get("sse-starlette relay")
    floor = event_us.get("raw ASGI relay")
    one_word = _div(run_us.get(f"service, in-process bus {this}"))
    out.targets += [
        Target("Redis bus / in-process bus, CPU per event", _ratio(shared, local), 1.5, "<=", "x"),
        Target("in-process bus / sse-starlette, CPU per event", _ratio(local, sse), 1.2, "<=", "x"),
        Target("one-word run, server CPU", one_word, 1.0, "<=", " ms"),
    ]
    out.notes.append(
        f"{words} words a run, {GAP * 1000:g} ms between tokens, {clients} clients: one write per "
        f"event; one-word runs from {word_clients} clients, no delay. Medians of {rounds} "
        "alternating rounds."
    )
    if local is not None and floor:
        out.notes.append(f"the in-process bus costs {local / floor:.1f}x the raw ASGI floor")
    if redis_problem:
        out.notes.append(f"Redis cases skipped: {redis_problem}")
    raw.update(per_event=per_event, per_run=per_run, per_turn=per_turn)
    out.raw = raw
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return round(value / base, 2)


def _div(us: float | None) -> float | None:
    return None if us is None else round(us / 1000, 3)
