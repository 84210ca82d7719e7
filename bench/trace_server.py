"""``agent-server`` with wall-clock timers around the steps of a run's critical path.

    BENCH_TRACE=1 uv run python -m bench run --scenario 2     (the harness starts this instead)
    python -m bench.trace_server --port 8000                   (by hand; same flags as agent-server)

A sampling profiler shows where the CPU goes; a latency target also needs to know where a
request *waits* (a storage thread, the upstream). This wraps the store's methods, the run
manager's ``start``, the agent's stream (time to its first event and first text delta) and the
OpenAI provider's request, without changing any of them, and writes count, mean, p50 and p99
per step to ``$BENCH_TRACE_OUT`` (JSON) when the server exits. Nothing here is used by the
service itself.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

__all__ = ["install", "main"]

STATS: defaultdict[str, list[float]] = defaultdict(list)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            STATS[name].append(time.perf_counter() - start)

    return wrapper


def _timed_stream(name: str, fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        start = time.perf_counter()
        first = True
        first_delta = True
        async for item in fn(*args, **kwargs):
            if first:
                STATS[f"{name} → first item"].append(time.perf_counter() - start)
                first = False
            kind = getattr(getattr(item, "type", None), "value", None)
            if first_delta and kind in ("text.delta", "text"):
                STATS[f"{name} → first text"].append(time.perf_counter() - start)
                first_delta = False
            yield item

    return wrapper


_TARGETS: list[tuple[str, str, str, str]] = [
    # module, class, method, kind
    ("app.storage.sqlite.store", "SQLiteStore", "get_or_create_session", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "create_run", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "update_run", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "list_messages", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "append_messages", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "get_session", "call"),
    ("app.storage.sqlite.store", "SQLiteStore", "end_run", "call"),
    ("app.runs", "RunManager", "start", "call"),
    ("app.runs", "RunManager", "_finalize", "call"),
    ("app.runs.start", "Starter", "start", "call"),
    ("app.runs.start", "Starter", "_admit", "call"),
    ("app.runs.start", "Starter", "_launch", "call"),
    ("agent_runtime.agent", "AgentCore", "stream", "stream"),
    ("agent_runtime.providers.openai", "OpenAIModel", "_open", "call"),
    ("agent_runtime.providers.openai", "OpenAIModel", "stream", "stream"),
    ("agent_runtime.providers.demo", "DemoModel", "stream", "stream"),
]


def install() -> None:
    """Wrap the targets (those that exist in this build)."""
    for module_name, class_name, method, kind in _TARGETS:
        try:
            owner = getattr(importlib.import_module(module_name), class_name)
            fn = getattr(owner, method)
        except (ImportError, AttributeError):
            continue
        name = f"{class_name}.{method}"
        wrapped = _timed_stream(name, fn) if kind == "stream" else _timed(name, fn)
        setattr(owner, method, wrapped)
    atexit.register(_dump)


def _dump() -> None:
    out = os.environ.get("BENCH_TRACE_OUT")
    summary: dict[str, dict[str, float]] = {}
    for name, values in sorted(STATS.items()):
        ordered = sorted(values)
        count = len(ordered)
        summary[name] = {
            "n": count,
            "mean_ms": 1000 * sum(ordered) / count,
            "p50_ms": 1000 * ordered[count // 2],
            "p99_ms": 1000 * ordered[min(count - 1, round(0.99 * (count - 1)))],
            "total_s": sum(ordered),
        }
    text = json.dumps(summary, indent=1)
    if out:
        with open(out, "w", encoding="utf-8") as file:
            file.write(text)
    else:
        print(text, file=sys.stderr)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # uvicorn re-raises the signal it stopped on once it is done; the default action would
    # end the process before atexit handlers run
    _dump()
    sys.exit(0)


def _memory_snapshot(signum: int, frame: FrameType | None) -> None:
    """On SIGUSR1 (with ``BENCH_TRACEMALLOC=1``): the live allocations by line, to a file."""
    import tracemalloc

    snapshot = tracemalloc.take_snapshot()
    stats = snapshot.statistics("lineno")
    out = os.environ.get("BENCH_TRACE_OUT", "trace.json") + ".memory.txt"
    with open(out, "w", encoding="utf-8") as file:
        total = sum(stat.size for stat in stats)
        file.write(f"total traced: {total} bytes in {sum(s.count for s in stats)} blocks\n")
        for stat in stats[:60]:
            file.write(f"{stat.size:>12} {stat.count:>8} {stat.traceback}\n")


def main() -> int:
    install()
    if os.environ.get("BENCH_TRACEMALLOC"):
        import tracemalloc

        tracemalloc.start(1)
        signal.signal(signal.SIGUSR1, _memory_snapshot)
    atexit.unregister(_dump)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    from app.cli import main as serve

    status = serve(sys.argv[1:])
    _dump()
    return status


if __name__ == "__main__":
    sys.exit(main())
