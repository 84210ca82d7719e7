"""Scenario 7: agent servers a user would pick instead, on the same machine and load generator.

Each peer is installed from PyPI into an environment of its own under ``bench/.peers/`` (with
``uv``), and serves the same words as the service's demo model:

- ``pydantic-ai``: pydantic-ai's AG-UI endpoint on a ``FunctionModel``
  (``bench/peer_apps/pydantic_ai_app.py``);
- ``langgraph``: ``langgraph dev`` (the in-memory API server of ``langgraph-cli[inmem]``) on a
  fake chat model streaming one word per chunk (``bench/peer_apps/langgraph_app/``).

A peer that cannot be installed or started is reported with the reason, never with a figure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.outcome import Config, Outcome
from bench.procs import (
    HOST,
    ROOT,
    Server,
    ServerFailed,
    agent_server,
    baseline_server,
    free_port,
    run_loadgen,
    start_server,
)
from bench.scenarios import relay_input

__all__ = ["PEERS", "Peer", "PeerUnavailable", "install", "scenario_peers"]

PEERS_DIR = ROOT / "bench" / ".peers"
APPS = ROOT / "bench" / "peer_apps"


class PeerUnavailable(RuntimeError):
    """The peer could not be installed or started here; the message says why."""


@dataclass(frozen=True)
class Peer:
    name: str
    packages: tuple[str, ...]
    check: str  # a module the environment must import

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


PEERS = {
    "pydantic-ai": Peer(
        "pydantic-ai",
        ("pydantic-ai-slim[ag-ui]", "uvicorn[standard]"),
        "pydantic_ai.ui.ag_ui",
    ),
    "langgraph": Peer("langgraph", ("langgraph-cli[inmem]", "langchain-core"), "langgraph_api"),
}


def _tail(text: bytes | str, lines: int = 6) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def install(peer: Peer) -> Path:
    """The peer's interpreter, installing it first if needed; PeerUnavailable with the reason."""
    if peer.python.exists():
        probe = subprocess.run(
            [str(peer.python), "-c", f"import {peer.check}"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return peer.python
    uv = shutil.which("uv")
    if uv is None:
        raise PeerUnavailable("uv is not on PATH, so the peer cannot be installed")
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    steps = [
        [uv, "venv", "-q", "--python", "3.11", str(peer.venv)],
        [uv, "pip", "install", "-q", "--python", str(peer.python), *peer.packages],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(f"`{' '.join(step[:3])}` did not finish in 900 s") from None
        if done.returncode != 0:
            raise PeerUnavailable(
                f"`uv {' '.join(step[1:3])} {' '.join(peer.packages)}` failed: {_tail(done.stderr)}"
            )
    return peer.python


def _versions(python: Path, names: list[str]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception: out[n] = '?'\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, check=False, timeout=60
    )
    try:
        result: dict[str, str] = json.loads(done.stdout)
    except ValueError:
        return {}
    return result


def start_pydantic_ai(python: Path) -> Server:
    port = free_port()
    command = [
        str(python),
        "-m",
        "uvicorn",
        "bench.peer_apps.pydantic_ai_app:app",
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return start_server("pydantic-ai", command, port=port, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)


def start_langgraph(python: Path) -> Server:
    port = free_port()
    langgraph = python.parent / "langgraph"
    command = [
        str(langgraph),
        "dev",
        "--no-browser",
        "--no-reload",
        "--host",
        HOST,
        "--port",
        str(port),
        # the default (10) would queue most of the 100 concurrent runs
        "--n-jobs-per-worker",
        "128",
    ]
    env = {
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "LOG_LEVEL": "WARNING",
    }
    # langgraph dev persists its in-memory state to .langgraph_api/ in its working directory
    # and reloads it at start: run it from a scratch copy of the app, never from the tree
    app_dir = Path(tempfile.mkdtemp(prefix="bench-langgraph-app-"))
    for name in ("graph.py", "langgraph.json"):
        shutil.copy(APPS / "langgraph_app" / name, app_dir / name)
    try:
        server = start_server(
            "langgraph", command, port=port, env=env, ready_path="/ok", timeout=120, cwd=app_dir
        )
    except ServerFailed:
        shutil.rmtree(app_dir, ignore_errors=True)
        raise
    server.cleanup.append(app_dir)
    return server


# --- what each server is asked, in the same words -----------------------------------------------


def _agui_body(text: str) -> str:
    body = {
        "threadId": "t-{n}",
        "runId": "r-{n}",
        "state": {},
        "messages": [{"id": "m-{n}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    return json.dumps(body)


def _langgraph_body(text: str) -> str:
    body = {
        "assistant_id": "chat",
        "input": {"messages": [{"role": "human", "content": text}]},
        "stream_mode": "messages-tuple",
    }
    return json.dumps(body)


RelayRequest = Callable[[str], dict[str, Any]]

RELAY: dict[str, RelayRequest] = {
    "agent-server": lambda text: {
        "path": "/v1/sessions/{n}/runs",
        "body": json.dumps({"input": text}),
        "ok_marker": "event: run.completed",
    },
    "pydantic-ai": lambda text: {
        "path": "/",
        "body": _agui_body(text),
        "ok_marker": "RUN_FINISHED",
        "headers": {"accept": "text/event-stream"},
    },
    "langgraph": lambda text: {
        "path": "/runs/stream",
        "body": _langgraph_body(text),
        "ok_marker": "event: messages",  # the stream ends after the last message chunk
    },
}


def _relay(
    server: Server, name: str, text: str, levels: list[tuple[int, int]], words: int
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    request = RELAY[name](text)
    for concurrency, runs in levels:
        result = run_loadgen(
            {
                "task": "relay",
                "host": HOST,
                "port": server.port,
                "concurrency": concurrency,
                "runs_per_client": runs,
                "server_pid": server.pid,
                "time_limit": 90,
                **request,
            },
            timeout=900,
        )
        if "error" not in result:
            # "You said: " and the input: words + 2 deltas per completed run
            result["deltas_per_s"] = result["runs"] * (words + 2) / (result["wall_s"] or 1e-9)
        results[str(concurrency)] = result
    return results


def scenario_peers(cfg: Config) -> Outcome:
    """7. Relay and waiting memory of agent-server beside pydantic-ai and LangGraph."""
    words = cfg.pick(2000, 100)
    levels: list[tuple[int, int]] = cfg.pick([(1, 3), (10, 1), (100, 1)], [(1, 1)])
    waiting = cfg.pick(1000, 20)
    text = relay_input(words)
    out = Outcome(7, "Peers: relay and waiting memory beside pydantic-ai and LangGraph")
    out.columns = [
        "server",
        "measure",
        "value",
        "ratio to agent-server",
        "server CPU%",
        "loadgen CPU%",
    ]
    relay: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    unavailable: dict[str, str] = {}

    idle_spec = {
        "task": "idle_streams",
        "host": HOST,
        "streams": waiting,
        "rest_seconds": 3.0,
        "time_limit": 120,
    }
    # agent-server: relay, runs waiting in the background, runs waiting with an open stream
    env = {
        "AGENT_MAX_CONCURRENT_RUNS": str(waiting + 200),
        "AGENT_MAX_QUEUED_RUNS": str(waiting + 200),
        "AGENT_CONFIRMATION_TIMEOUT": "3600",
    }
    with_server = agent_server("peers-agent", env)
    try:
        relay["agent-server"] = _relay(with_server, "agent-server", text, levels, words)
        memory["agent-server (run waiting, open stream)"] = run_loadgen(
            {
                **idle_spec,
                "port": with_server.port,
                "server_pid": with_server.pid,
                "path": "/v1/sessions/{n}/runs",
                "body": '{"input": "delete {n}"}',
                "marker": "confirmation_requested",
            }
        )
    finally:
        with_server.stop()
    with_server = agent_server("peers-agent-bg", env)
    try:
        memory["agent-server (background run waiting)"] = run_loadgen(
            {
                "task": "capacity",
                "host": HOST,
                "port": with_server.port,
                "server_pid": with_server.pid,
                "runs": waiting,
                "rest_seconds": 3.0,
            }
        )
    finally:
        with_server.stop()
    base = baseline_server("peers-floor")
    try:
        memory["floor (sse-starlette, idle open stream)"] = run_loadgen(
            {
                **idle_spec,
                "port": base.port,
                "server_pid": base.pid,
                "method": "GET",
                "path": "/wait/{n}",
                "body": None,
                "marker": "ready",
            }
        )
    finally:
        base.stop()

    for name, starter in (("pydantic-ai", start_pydantic_ai), ("langgraph", start_langgraph)):
        peer = PEERS[name]
        try:
            python = install(peer)
            versions[name] = _versions(
                python,
                ["pydantic-ai-slim", "ag-ui-protocol"]
                if name == "pydantic-ai"
                else ["langgraph", "langgraph-api", "langgraph-runtime-inmem", "langchain-core"],
            )
            server = starter(python)
        except (PeerUnavailable, ServerFailed, OSError) as exc:
            detail = f"{exc}" + (f" — {_tail(exc.log)}" if isinstance(exc, ServerFailed) else "")
            unavailable[name] = detail
            out.notes.append(f"{name}: not measured: {detail}")
            continue
        try:
            relay[name] = _relay(server, name, text, levels, words)
            # memory on a fresh process: the relay's freed heap would hide the growth
            server.stop()
            server = starter(python)
            if name == "pydantic-ai":
                memory["pydantic-ai (idle open stream)"] = run_loadgen(
                    {
                        **idle_spec,
                        "port": server.port,
                        "server_pid": server.pid,
                        "path": "/",
                        "body": _agui_body("park {n}"),
                        "marker": "RUN_STARTED",
                    }
                )
            else:
                memory["langgraph (thread suspended at interrupt())"] = run_loadgen(
                    {
                        "task": "lg_interrupts",
                        "host": HOST,
                        "port": server.port,
                        "server_pid": server.pid,
                        "runs": waiting,
                        "rest_seconds": 3.0,
                        "time_limit": 300,
                    },
                    timeout=900,
                )
        except Exception as exc:
            unavailable[name] = f"failed while measured: {exc}"
            out.notes.append(f"{name}: failed while measured: {str(exc)[-500:]}")
        finally:
            server.stop()

    ours = relay.get("agent-server", {})
    for name, results in relay.items():
        for concurrency, result in results.items():
            mine = ours.get(concurrency, {})
            out.rows.append(
                [
                    name,
                    f"relay, {concurrency} clients: words/s",
                    result.get("deltas_per_s"),
                    _ratio(result.get("deltas_per_s"), mine.get("deltas_per_s")),
                    result.get("server_cpu_pct"),
                    result.get("client_cpu_pct"),
                ]
            )
    reference = memory.get("agent-server (run waiting, open stream)", {})
    for name, result in memory.items():
        per = result.get("bytes_per_stream", result.get("bytes_per_run"))
        result["bytes_per_unit"] = per
        out.rows.append(
            [
                name,
                f"memory per unit, {waiting:,} units (bytes)",
                per,
                _ratio(per, reference.get("bytes_per_stream")),
                result.get("rest_cpu_pct"),
                None,
            ]
        )
    lg = memory.get("langgraph (thread suspended at interrupt())", {})
    ours_bg = memory.get("agent-server (background run waiting)", {})
    if lg.get("runs") and ours_bg.get("runs"):
        out.notes.append(
            f"Resuming all {waiting:,}: agent-server approved and finished its background runs "
            f"in {ours_bg['approve_all_s']:.2f} s ({ours_bg['statuses']}); LangGraph resumed "
            f"its threads in {lg['resume_all_s']:.2f} s ({lg['completed']} completed)."
        )
    out.notes.append(
        "pydantic-ai keeps no run on the server while a tool call awaits approval: its "
        "deferred tools end the run and hand the pending calls to the client, which sends a new "
        "request with the results. Its server-side cost of a waiting run is therefore nil by "
        "design; the comparable figure is an open stream whose model has not answered yet."
    )
    out.notes.append(
        "LangGraph's interrupt() suspends a thread: the run ends, its checkpoint stays in the "
        "server (in memory with langgraph dev), and a new run resumes it; that is the comparable "
        "of agent-server's background run waiting for a confirmation."
    )
    out.raw = {
        "relay": relay,
        "memory": memory,
        "versions": versions,
        "unavailable": unavailable,
        "words": words,
    }
    return out


def _ratio(value: Any, base: Any) -> float | None:
    if not isinstance(value, int | float) or not isinstance(base, int | float) or not base:
        return None
    return float(value) / float(base)
