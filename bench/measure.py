"""What the load generator's tasks share: percentiles, the server's CPU and memory beside the
load generator's own, and the HTTP steps every task takes (a pool of connections, one streamed
run, reading a stream up to a frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psutil

from bench.client import Connection, HTTPError, Response, SSEParser

__all__ = [
    "ServerProbe",
    "Window",
    "bounded",
    "open_pool",
    "percentile",
    "read_until",
    "summary_ms",
    "unique_tag",
]

Spec = dict[str, Any]
Result = dict[str, Any]


# --- measuring ------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest-rank on the sorted values; nan when empty."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(values: list[float]) -> dict[str, float]:
    """p50, p90, p99, mean and max of durations in seconds, as milliseconds."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": percentile(values, 0.50) * 1000,
        "p90": percentile(values, 0.90) * 1000,
        "p99": percentile(values, 0.99) * 1000,
        "mean": statistics.fmean(values) * 1000,
        "max": max(values) * 1000,
    }


class ServerProbe:
    """CPU time and RSS of a server process and its children (uvicorn workers)."""

    def __init__(self, pid: int | None) -> None:
        self.process = psutil.Process(pid) if pid else None

    def _tree(self) -> list[psutil.Process]:
        if self.process is None:
            return []
        try:
            return [self.process, *self.process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu(self) -> float:
        total = 0.0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss(self) -> int:
        total = 0
        for proc in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total


class Window:
    """Wall time, own CPU and server CPU between ``start`` and ``stop``."""

    def __init__(self, probe: ServerProbe) -> None:
        self.probe = probe
        self.wall = 0.0
        self.client_cpu = 0.0
        self.server_cpu = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()
        self._c = time.process_time()
        self._s = self.probe.cpu()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t
        self.client_cpu = time.process_time() - self._c
        self.server_cpu = self.probe.cpu() - self._s

    def report(self) -> Result:
        wall = self.wall or 1e-9
        return {
            "wall_s": self.wall,
            "client_cpu_pct": 100 * self.client_cpu / wall,
            "server_cpu_pct": 100 * self.server_cpu / wall,
        }


def unique_tag() -> str:
    return secrets.token_hex(4)


async def bounded(
    items: Iterable[Any], concurrency: int, work: Callable[[Any], Awaitable[None]]
) -> None:
    """Run ``work`` over ``items`` with at most ``concurrency`` at a time."""
    iterator = iter(items)

    async def worker() -> None:
        for item in iterator:
            await work(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def open_pool(host: str, port: int, size: int) -> list[Connection]:
    connections = [Connection(host, port) for _ in range(size)]
    await asyncio.gather(*(conn.connect() for conn in connections))
    return connections


async def read_until(
    conn: Connection, response: Response, parser: SSEParser, wanted: Callable[[Any], bool]
) -> Any:
    """Read SSE until an event satisfies ``wanted``; the event."""
    for event in list(parser.events):
        if wanted(event):
            parser.events.remove(event)
            return event
    while True:
        data = await conn.read_chunk(response)
        if not data:
            raise HTTPError("the stream ended first")
        for event in parser.feed(data):
            if wanted(event):
                return event
