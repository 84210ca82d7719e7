"""Where a waiting run's memory goes: tracemalloc and object counts in a worker holding N runs
that wait for a confirmation, for this tree and for earlier commits beside it.

    uv run python -m bench.waiting_profile [--runs 2000] [--ref 3807e5a --ref main] [--top 25]

For each code (each ``--ref``, checked out as ``bench.procs.checkout`` does, then this tree) a
worker is started through this file's ``serve`` mode: ``agent-server`` with tracemalloc on, and
a SIGUSR1 handler that collects the garbage, dumps a snapshot and counts the live objects by
type. ``--warm`` background runs are started and reach their confirmation (whatever is made
once, on first use, is made then), a snapshot is taken, ``--runs`` more runs are started and
reach theirs, and a second snapshot is taken. Everything is given per waiting run:

- RSS and traced bytes of the second snapshot over the first, over ``--runs``;
- the allocations by line (the innermost frame), and by the innermost frame in ``app`` or
  ``agent_runtime`` (what of ours allocated it, through asyncio or the standard library);
- the objects by type (the garbage collector's view: containers, frames, tasks, futures).

The ``serve`` mode imports nothing from ``bench``, so a checkout's ``app`` runs under it
(``PYTHONPATH``) whether or not that checkout has this file. Nothing here is used by the
service itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
import types
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["main", "profile_code"]

_FRAMES = 30
_OURS = ("/app/", "/agent_runtime/")


# --- the worker ------------------------------------------------------------------------------


def _dump(signum: int, frame: FrameType | None) -> None:
    """On SIGUSR1: a snapshot and the type counts to ``$BENCH_PROFILE_OUT.<n>``."""
    out = os.environ["BENCH_PROFILE_OUT"]
    index = len(list(Path(out).parent.glob(Path(out).name + ".*.done")))
    gc.collect()
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    samples: dict[str, object] = {}
    for item in gc.get_objects():
        name = _kind(item)
        counts[name] += 1
        sizes[name] += sys.getsizeof(item)
        samples[name] = item  # the last one the collector lists: usually among the newest
    tracemalloc.take_snapshot().dump(f"{out}.{index}.snapshot")
    by_type = {name: [counts[name], sizes[name], _made_at(samples[name])] for name in counts}
    Path(f"{out}.{index}.types.json").write_text(json.dumps(by_type))
    Path(f"{out}.{index}.done").write_text("")


def _made_at(item: object) -> str:
    """Where ``item`` was allocated: its innermost frames of ``app`` or ``agent_runtime``."""
    trace = tracemalloc.get_object_traceback(item)
    if trace is None:
        return ""
    ours = [f for f in reversed(trace) if any(part in f.filename for part in _OURS)]
    return " < ".join(_short(f.filename, f.lineno) for f in ours[:3])


def _kind(item: object) -> str:
    """An object's type; a coroutine's, async generator's or task's code by name too."""
    kind = type(item)
    name = f"{kind.__module__}.{kind.__qualname__}"
    code = None
    if isinstance(item, types.CoroutineType):
        code = item.cr_code
    elif isinstance(item, types.AsyncGeneratorType):
        code = item.ag_code
    elif isinstance(item, asyncio.Task) and not item.done():
        coro = item.get_coro()
        code = coro.cr_code if isinstance(coro, types.CoroutineType) else None
    if code is not None:
        name = f"{name} {code.co_qualname}"
    return name


def serve(argv: Sequence[str]) -> int:
    """``agent-server`` with tracemalloc on and ``_dump`` on SIGUSR1."""
    import app.main  # noqa: F401  (imported untraced: tracing makes imports minutes long)
    from app.cli import main as serve_app  # the checkout's app when PYTHONPATH names one

    tracemalloc.start(_FRAMES)
    signal.signal(signal.SIGUSR1, _dump)
    return serve_app(list(argv))


# --- the driver --------------------------------------------------------------------------------


def _pending(state: dict[str, Any]) -> int:
    extensions = state.get("extensions", {})
    return int(sum(item.get("pending", 0) for item in extensions.values()))


async def _waiting_runs(url: str, tag: str, first: int, count: int) -> None:
    """Start ``count`` background runs of ``delete fileN`` and wait until all ask."""
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        before = _pending((await client.get("/debug/state")).json())
        gate = asyncio.Semaphore(32)

        async def start(index: int) -> None:
            async with gate:
                answer = await client.post(
                    f"/v1/sessions/prof-{tag}-{index}/runs",
                    json={"input": f"delete file{index}", "background": True},
                )
                if answer.status_code != 202:
                    raise RuntimeError(f"run {index}: {answer.status_code} {answer.text}")

        await asyncio.gather(*(start(index) for index in range(first, first + count)))
        deadline = time.monotonic() + 300
        while _pending((await client.get("/debug/state")).json()) < before + count:
            if time.monotonic() > deadline:
                raise TimeoutError("the runs never all reached their confirmation")
            await asyncio.sleep(0.1)


def _snapshot(pid: int, out: Path, index: int) -> tuple[tracemalloc.Snapshot, dict[str, Any]]:
    os.kill(pid, signal.SIGUSR1)
    done = Path(f"{out}.{index}.done")
    deadline = time.monotonic() + 300
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker wrote no snapshot")
        time.sleep(0.1)
    snapshot = tracemalloc.Snapshot.load(f"{out}.{index}.snapshot")
    by_type = json.loads(Path(f"{out}.{index}.types.json").read_text())
    return snapshot, by_type


def _ours(trace: tracemalloc.Traceback) -> str:
    """The innermost frame of ``app`` or ``agent_runtime`` (the allocation's own if none)."""
    for frame in reversed(trace):  # a traceback lists the most recent frame last
        if any(part in frame.filename for part in _OURS):
            return _short(frame.filename, frame.lineno)
    return _short(trace[-1].filename, trace[-1].lineno)


def _innermost(trace: tracemalloc.Traceback) -> str:
    return _short(trace[-1].filename, trace[-1].lineno)


def _short(filename: str, lineno: int) -> str:
    for marker in ("/app/", "/agent_runtime/", "/asyncio/", "site-packages/", "/lib/python"):
        if marker in filename:
            cut = filename.index(marker) + (len(marker) if "python" in marker else 1)
            if marker == "site-packages/":
                cut = filename.index(marker) + len(marker)
            return f"{filename[cut:]}:{lineno}"
    return f"{filename}:{lineno}"


def _by(
    diffs: list[tracemalloc.StatisticDiff], key: Any, runs: int, top: int
) -> list[tuple[float, float, str]]:
    sizes: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for diff in diffs:
        name = key(diff.traceback)
        sizes[name] += diff.size_diff
        counts[name] += diff.count_diff
    ranked = sorted(sizes.items(), key=lambda item: -item[1])[:top]
    return [(size / runs, counts[name] / runs, name) for name, size in ranked]


def profile_code(
    label: str,
    source: Path | None,
    runs: int,
    warm: int,
    top: int,
    show_traces: Sequence[str] = (),
) -> dict[str, Any]:
    """One worker of ``source`` (None: this tree) profiled with ``runs`` waiting runs."""
    import psutil

    scratch = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    out = scratch / "dump"
    env = {
        "AGENT_MAX_CONCURRENT_RUNS": str(runs + warm + 100),
        "AGENT_MAX_QUEUED_RUNS": str(runs + warm + 100),
        "AGENT_CONFIRMATION_TIMEOUT": "3600",
        "AGENT_RUN_TIMEOUT": "3600",
        "AGENT_WARMUP": "0",
        "BENCH_PROFILE_OUT": str(out),
    }
    server = _serve(label, env, source)
    try:
        probe = psutil.Process(server.pid)
        asyncio.run(_waiting_runs(server.url, "w", 0, warm))
        time.sleep(0.5)
        rss0 = probe.memory_info().rss
        before, types0 = _snapshot(server.pid, out, 0)
        asyncio.run(_waiting_runs(server.url, "n", 0, runs))
        time.sleep(0.5)
        rss1 = probe.memory_info().rss
        after, types1 = _snapshot(server.pid, out, 1)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    diffs = after.compare_to(before, "traceback")
    traced = sum(diff.size_diff for diff in diffs)
    traces = []
    for pattern in show_traces:
        matching = [d for d in diffs if d.size_diff > 0 and pattern in _ours(d.traceback)]
        for diff in sorted(matching, key=lambda d: -d.size_diff)[:3]:
            frames = [_short(f.filename, f.lineno) for f in reversed(diff.traceback)][:12]
            traces.append(f"{diff.size_diff / runs:>8.0f}  {pattern}: " + " < ".join(frames))
    objects = []
    for name, (count, size, made_at) in types1.items():
        count0, size0, _ = types0.get(name, [0, 0, ""])
        if size - size0 > 0:
            shown = f"{name}  [{made_at}]" if made_at else name
            objects.append(((size - size0) / runs, (count - count0) / runs, shown))
    objects.sort(reverse=True)
    return {
        "label": label,
        "runs": runs,
        "rss_per_run": (rss1 - rss0) / runs,
        "traced_per_run": traced / runs,
        "by_line": _by(diffs, _innermost, runs, top),
        "by_our_frame": _by(diffs, _ours, runs, top),
        "objects": objects[:top],
        "traces": traces,
    }


def _serve(label: str, env: dict[str, str], source: Path | None) -> Any:
    """``agent-server`` (as ``bench.procs.agent_server`` starts it) under this file's
    ``serve`` mode."""
    from bench.procs import ROOT, free_port, start_server

    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-profile-{label}-db-"))
    settings = {
        "AGENT_DEMO_TOKEN_DELAY": "0",
        "AGENT_DATABASE_URL": f"sqlite:///{workdir}/agent.db",
        "AGENT_DEBUG_ENDPOINTS": "1",
        **env,
    }
    if source is not None:
        settings["PYTHONPATH"] = str(source)
    command = [sys.executable, str(Path(__file__).resolve()), "serve", "--port", str(port)]
    server = start_server(
        f"profile-{label}", command, port=port, env=settings, timeout=120, cwd=source or ROOT
    )
    server.cleanup.append(workdir)
    return server


def _report(result: dict[str, Any]) -> str:
    lines = [
        f"== {result['label']}: {result['runs']} waiting runs",
        f"RSS per run {result['rss_per_run'] / 1024:.1f} KiB; "
        f"traced per run {result['traced_per_run'] / 1024:.1f} KiB",
        "-- by line (bytes/run, blocks/run)",
    ]
    lines += [f"{size:>8.0f} {count:>6.1f}  {name}" for size, count, name in result["by_line"]]
    lines.append("-- by our innermost frame (bytes/run, blocks/run)")
    lines += [f"{size:>8.0f} {count:>6.1f}  {name}" for size, count, name in result["by_our_frame"]]
    if result.get("traces"):
        lines.append("-- whole tracebacks of the allocations asked for (--trace)")
        lines += result["traces"]
    lines.append("-- objects by type, the GC's view (bytes/run, objects/run)")
    lines += [f"{size:>8.0f} {count:>6.2f}  {name}" for size, count, name in result["objects"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        return serve(args[1:])
    from bench.procs import checkout

    parser = argparse.ArgumentParser(prog="python -m bench.waiting_profile")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--ref", action="append", default=[], help="a commit to profile too")
    parser.add_argument("--json", type=Path, help="write the results here as well")
    parser.add_argument(
        "--trace", action="append", default=[], help="show whole tracebacks of FILE:LINE"
    )
    options = parser.parse_args(args)
    results = []
    for ref in options.ref:
        folder, commit = checkout(ref)
        try:
            results.append(
                profile_code(commit, folder, options.runs, options.warm, options.top, options.trace)
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(_report(results[-1]), flush=True)
    results.append(
        profile_code("this tree", None, options.runs, options.warm, options.top, options.trace)
    )
    print(_report(results[-1]), flush=True)
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
