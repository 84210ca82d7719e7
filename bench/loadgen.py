"""The load generator: one process of its own, apart from the server it measures.

    python -m bench.loadgen < spec.json > result.json

The orchestrator (``bench.run``) writes one JSON spec on stdin naming a ``task``; the answer is
one JSON object on stdout. Every task is bounded in count and in time, talks to loopback only,
and reports the CPU it used itself next to the CPU the server used in the same window (read
with psutil from the server's pid), so that a result shows which side was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psutil

from bench.client import Connection, FrameCounter, HTTPError, Response, SSEParser

__all__ = ["main", "percentile"]

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


def _unique() -> str:
    return secrets.token_hex(4)


async def _bounded(
    items: Iterable[Any], concurrency: int, work: Callable[[Any], Awaitable[None]]
) -> None:
    """Run ``work`` over ``items`` with at most ``concurrency`` at a time."""
    iterator = iter(items)

    async def worker() -> None:
        for item in iterator:
            await work(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _pool(host: str, port: int, size: int) -> list[Connection]:
    connections = [Connection(host, port) for _ in range(size)]
    await asyncio.gather(*(conn.connect() for conn in connections))
    return connections


# --- scenario 1 and 7: relay ----------------------------------------------------------------


async def _stream_once(
    conn: Connection,
    method: str,
    path: str,
    body: bytes | None,
    ok_marker: bytes,
    first_marker: bytes | None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One streamed request read to its end: frames, bytes, time to the first marker."""
    if not conn.connected:
        await conn.connect()
    sent = time.perf_counter()
    conn.send_request(method, path, body, headers)
    response = await conn.read_head()
    if response.status != 200:
        await conn.read_body(response)
        return {"status": response.status, "frames": 0, "bytes": 0, "chunks": 0, "ok": False}
    counter = FrameCounter()
    size = 0
    chunks = 0
    first: float | None = None
    window = b""
    while True:
        data = await conn.read_chunk(response)
        if not data:
            break
        chunks += 1
        size += len(data)
        counter.feed(data)
        if first is None and first_marker is not None:
            window = (window + data)[-4096:] if len(data) < 4096 else data
            if first_marker in window:
                first = time.perf_counter() - sent
    if response.headers.get("connection", "").lower() == "close":
        await conn.close()
    return {
        "status": 200,
        "frames": counter.frames,
        "bytes": size,
        "ok": ok_marker in counter.tail,
        "chunks": chunks,
        "first": first,
        "total": time.perf_counter() - sent,
    }


async def task_relay(spec: Spec) -> Result:
    """``concurrency`` clients, each streaming ``runs_per_client`` runs back to back."""
    host, port = spec["host"], spec["port"]
    method = spec.get("method", "POST")
    path_template: str = spec["path"]
    body_template: str | None = spec.get("body")
    ok_marker = spec["ok_marker"].encode()
    concurrency: int = spec["concurrency"]
    runs: int = spec["runs_per_client"]
    deadline = time.perf_counter() + float(spec.get("time_limit", 120))
    tag = _unique()
    probe = ServerProbe(spec.get("server_pid"))
    headers = spec.get("headers")

    def request_for(client: int, index: int) -> tuple[str, bytes | None]:
        name = f"{tag}-{client}-{index}"
        path = path_template.replace("{n}", name)
        body = None if body_template is None else body_template.replace("{n}", name).encode()
        return path, body

    # warm-up: one run on its own connection, not counted
    warm = Connection(host, port)
    path, body = request_for(-1, 0)
    warmup = await _stream_once(warm, method, path, body, ok_marker, None, headers)
    await warm.close()
    if not warmup["ok"]:
        return {"error": f"warm-up run failed: {warmup}"}
    connections = await _pool(host, port, concurrency)
    totals = {"frames": 0, "bytes": 0, "chunks": 0, "runs": 0, "ok": 0, "errors": 0}
    refused: dict[int, int] = {}
    timed_out = False

    async def client(index: int) -> None:
        nonlocal timed_out
        conn = connections[index]
        for run in range(runs):
            if time.perf_counter() > deadline:
                timed_out = True
                return
            path, body = request_for(index, run)
            try:
                result = await _stream_once(conn, method, path, body, ok_marker, None, headers)
            except (HTTPError, OSError, asyncio.IncompleteReadError):
                totals["errors"] += 1
                await conn.close()
                continue
            totals["runs"] += 1
            if result["status"] != 200:  # refused: counted, with its status, not streamed
                totals["errors"] += 1
                refused[result["status"]] = refused.get(result["status"], 0) + 1
                continue
            totals["frames"] += result["frames"]
            totals["bytes"] += result["bytes"]
            totals["chunks"] += result["chunks"]
            totals["ok"] += 1 if result["ok"] else 0

    window = Window(probe)
    window.start()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    window.stop()
    for conn in connections:
        await conn.close()
    wall = window.wall or 1e-9
    return {
        **totals,
        **window.report(),
        "events_per_s": totals["frames"] / wall,
        "runs_per_s": totals["runs"] / wall,
        "frames_per_run": totals["frames"] / max(1, totals["runs"]),
        "bytes_per_frame": totals["bytes"] / max(1, totals["frames"]),
        # HTTP chunks received per run: one per write of the server (batching shows here)
        "writes_per_run": totals["chunks"] / max(1, totals["runs"]),
        "timed_out": timed_out,
        "refused": {str(status): count for status, count in refused.items()},
        "concurrency": concurrency,
    }


# --- scenario 2: time to first event through the service vs the upstream directly -----------


async def task_ttfe(spec: Spec) -> Result:
    """Sequential requests, alternating the service and the upstream called directly."""
    import openai

    host, port = spec["host"], spec["port"]
    count: int = spec["requests"]
    warmup: int = spec.get("warmup", 20)
    deadline = time.perf_counter() + float(spec.get("time_limit", 120))
    client = openai.AsyncOpenAI(
        base_url=spec["upstream_url"], api_key="bench", max_retries=0, timeout=30
    )
    body_text = json.dumps({"input": spec.get("input", "hello there")})
    conn = Connection(host, port)
    await conn.connect()
    tag = _unique()
    marker = b"event: text.delta"

    async def direct() -> float:
        start = time.perf_counter()
        stream = await client.chat.completions.create(
            model=spec["model"],
            messages=[{"role": "user", "content": spec.get("input", "hello there")}],
            stream=True,
        )
        first = float("nan")
        async for chunk in stream:
            if first != first and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
        return first

    async def service(index: int) -> float:
        path = f"/v1/sessions/ttfe-{tag}-{index}/runs"
        result = await _stream_once(
            conn, "POST", path, body_text.encode(), b"run.completed", marker
        )
        if not result["ok"] or result["first"] is None:
            raise RuntimeError(f"a run through the service failed: {result}")
        return float(result["first"])

    direct_s: list[float] = []
    service_s: list[float] = []
    for index in range(warmup + count):
        if time.perf_counter() > deadline:
            break
        # alternate the order, so that neither side always follows the other
        if index % 2:
            d = await direct()
            s = await service(index)
        else:
            s = await service(index)
            d = await direct()
        if index >= warmup:
            direct_s.append(d)
            service_s.append(s)
    await conn.close()
    await client.close()
    added = [s - d for s, d in zip(service_s, direct_s, strict=True)]
    return {
        "direct": summary_ms(direct_s),
        "service": summary_ms(service_s),
        "added_p50_ms": (percentile(service_s, 0.5) - percentile(direct_s, 0.5)) * 1000,
        "added_p99_ms": (percentile(service_s, 0.99) - percentile(direct_s, 0.99)) * 1000,
        "paired_added": summary_ms(added),
    }


# --- scenario 8: one stream through a distant Redis ------------------------------------------


async def task_stream_timing(spec: Spec) -> Result:
    """Sequential runs, one at a time: time to the first text.delta, to the terminal event,
    and the events of each (a stream's own rate, with no other load)."""
    host, port = spec["host"], spec["port"]
    count: int = spec["requests"]
    warmup: int = spec.get("warmup", 3)
    deadline = time.perf_counter() + float(spec.get("time_limit", 120))
    body = json.dumps({"input": spec["input"]}).encode()
    conn = Connection(host, port)
    await conn.connect()
    tag = _unique()
    firsts: list[float] = []
    totals: list[float] = []
    rates: list[float] = []
    frames: list[int] = []
    for index in range(warmup + count):
        if time.perf_counter() > deadline:
            break
        path = f"/v1/sessions/{tag}-0-{index}/runs"
        result = await _stream_once(
            conn, "POST", path, body, b"run.completed", b"event: text.delta"
        )
        if not result["ok"] or result["first"] is None:
            raise RuntimeError(f"a run failed: {result}")
        if index < warmup:
            continue
        firsts.append(result["first"])
        totals.append(result["total"])
        frames.append(result["frames"])
        rates.append(result["frames"] / result["total"])
    await conn.close()
    return {
        "ttfe": summary_ms(firsts),
        "total": summary_ms(totals),
        "events_per_run": sum(frames) / max(1, len(frames)),
        "events_per_s": sum(frames) / max(1e-9, sum(totals)),
        "runs": len(totals),
    }


# --- scenario 4: confirmation round trip ------------------------------------------------------


async def _read_until(
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


async def _acknowledged(answers: Connection, t0: float) -> float:
    head = await answers.read_head()
    await answers.read_body(head)
    if head.status != 202:
        raise RuntimeError(f"the answer was not accepted: {head.status} {head.body!r}")
    return time.perf_counter() - t0


async def _arrived(
    follow: Connection, response: Response, parser: SSEParser, event_name: str, t0: float
) -> float:
    await _read_until(follow, response, parser, lambda e: e.event == event_name)
    return time.perf_counter() - t0


async def task_confirm(spec: Spec) -> Result:
    """POST /external-events → tool.call.completed on a stream already open, ``n`` times."""
    host = spec["host"]
    start_port, follow_port, answer_port = spec["port"], spec["follow_port"], spec["answer_port"]
    count: int = spec["requests"]
    warmup: int = spec.get("warmup", 10)
    baseline: bool = spec.get("baseline", False)
    deadline = time.perf_counter() + float(spec.get("time_limit", 120))
    control = Connection(host, start_port)
    answers = Connection(host, answer_port)
    tag = _unique()
    round_trips: list[float] = []
    acks: list[float] = []
    for index in range(warmup + count):
        if time.perf_counter() > deadline:
            break
        session = f"confirm-{tag}-{index}"
        follow = Connection(host, follow_port)
        await follow.connect()
        parser = SSEParser()
        if baseline:
            follow.send_request("GET", f"/wait/{session}")
            response = await follow.read_head()
            await _read_until(follow, response, parser, lambda e: e.event == "ready")
            body = json.dumps({"session_id": session}).encode()
            path = f"/signal/{session}"
            done_event = "signalled"
        else:
            started = await control.request(
                "POST",
                f"/v1/sessions/{session}/runs",
                {"input": f"delete file{index}", "background": True},
            )
            run_id = started.json()["run_id"]
            follow.send_request("GET", f"/v1/runs/{run_id}/events")
            response = await follow.read_head()
            asked = await _read_until(
                follow,
                response,
                parser,
                lambda e: e.event == "custom" and "confirmation_requested" in e.data,
            )
            call_id = json.loads(asked.data)["data"]["payload"]["tool_call_id"]
            body = json.dumps(
                {
                    "session_id": session,
                    "run_id": run_id,
                    "name": "confirmation_response",
                    "payload": {"tool_call_id": call_id, "approved": True},
                }
            ).encode()
            path = "/external-events"
            done_event = "tool.call.completed"
        if not answers.connected:
            await answers.connect()
        t0 = time.perf_counter()
        answers.send_request("POST", path, body)

        ack_s, trip_s = await asyncio.gather(
            _acknowledged(answers, t0), _arrived(follow, response, parser, done_event, t0)
        )
        if not baseline:  # read the run to its end, so the next starts on an idle server
            await _read_until(follow, response, parser, lambda e: e.event.startswith("run."))
        await follow.close()
        if index >= warmup:
            round_trips.append(trip_s)
            acks.append(ack_s)
    await control.close()
    await answers.close()
    return {"round_trip": summary_ms(round_trips), "ack": summary_ms(acks)}


# --- scenario 3: many runs waiting for a confirmation ---------------------------------------


async def _wait_state(
    conn: Connection, path: str, done: Callable[[Any], bool], limit: float
) -> Any:
    deadline = time.perf_counter() + limit
    while True:
        state = (await conn.request("GET", path)).json()
        if done(state):
            return state
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{path} never reached the expected state: {state}")
        await asyncio.sleep(0.05)


def _pending(state: Any) -> int:
    extensions = state.get("extensions", {})
    return int(sum(item.get("pending", 0) for item in extensions.values()))


async def task_capacity(spec: Spec) -> Result:
    """``n`` runs parked at a confirmation: memory, CPU at rest, then approve them all."""
    host, port, count = spec["host"], spec["port"], int(spec["runs"])
    concurrency: int = spec.get("concurrency", 32)
    rest: float = spec.get("rest_seconds", 10.0)
    baseline: bool = spec.get("baseline", False)
    limit = float(spec.get("time_limit", 300))
    probe = ServerProbe(spec["server_pid"])
    tag = _unique()
    control = Connection(host, port)
    state_path = "/state" if baseline else "/debug/state"
    settle: float = spec.get("settle", 1.0)
    await asyncio.sleep(settle / 2)
    rss_before = probe.rss()
    pool = await _pool(host, port, concurrency)
    free = list(pool)
    run_ids: dict[int, str] = {}

    async def submit(index: int) -> None:
        conn = free.pop()
        try:
            if baseline:
                answer = await conn.request("POST", f"/park/{tag}-{index}")
            else:
                answer = await conn.request(
                    "POST",
                    f"/v1/sessions/cap-{tag}-{index}/runs",
                    {"input": f"delete file{index}", "background": True},
                )
            if answer.status != 202:
                raise RuntimeError(f"run {index} was refused: {answer.status} {answer.body!r}")
            run_ids[index] = answer.json()["run_id"]
        finally:
            free.append(conn)

    t0 = time.perf_counter()
    await _bounded(range(count), concurrency, submit)
    submitted_s = time.perf_counter() - t0
    if baseline:
        await _wait_state(control, state_path, lambda s: s["parked"] >= count, limit)
    else:
        await _wait_state(control, state_path, lambda s: _pending(s) >= count, limit)
    waiting_s = time.perf_counter() - t0
    await asyncio.sleep(settle)  # let allocations settle
    rss_waiting = probe.rss()
    cpu0, w0 = probe.cpu(), time.perf_counter()
    await asyncio.sleep(rest)
    rest_cpu_pct = 100 * (probe.cpu() - cpu0) / (time.perf_counter() - w0)

    # the tool call ids, as a front end would have read them from the stream
    call_ids: dict[int, str] = {}

    async def read_call(index: int) -> None:
        conn = Connection(host, port)
        await conn.connect()
        try:
            conn.send_request("GET", f"/v1/runs/{run_ids[index]}/events?after=3")
            response = await conn.read_head()
            event = await _read_until(
                conn, response, SSEParser(), lambda e: "confirmation_requested" in e.data
            )
            call_ids[index] = json.loads(event.data)["data"]["payload"]["tool_call_id"]
        finally:
            conn.abort()

    if not baseline:
        await _bounded(range(count), concurrency, read_call)
    accepted = 0

    async def approve(index: int) -> None:
        nonlocal accepted
        conn = free.pop()
        try:
            if baseline:
                answer = await conn.request("POST", f"/unpark/{tag}-{index}")
            else:
                answer = await conn.request(
                    "POST",
                    "/external-events",
                    {
                        "session_id": f"cap-{tag}-{index}",
                        "run_id": run_ids[index],
                        "name": "confirmation_response",
                        "payload": {"tool_call_id": call_ids[index], "approved": True},
                    },
                )
            accepted += 1 if answer.status == 202 else 0
        finally:
            free.append(conn)

    window = Window(probe)
    window.start()
    await _bounded(range(count), concurrency, approve)
    approved_s = time.perf_counter() - window._t
    if baseline:
        await _wait_state(control, state_path, lambda s: s["tasks"] == 0, limit)
    else:
        await _wait_state(control, state_path, lambda s: s["runs"] == 0, limit)
    window.stop()
    statuses: dict[str, int] = {}
    if not baseline:

        async def check(index: int) -> None:
            conn = free.pop()
            try:
                view = (await conn.request("GET", f"/v1/runs/{run_ids[index]}")).json()
                status = view["status"]
                if status == "completed" and "Deleted" not in (view["output"] or {}).get(
                    "content", ""
                ):
                    status = "completed-wrong-output"
                statuses[status] = statuses.get(status, 0) + 1
            finally:
                free.append(conn)

        await _bounded(range(count), concurrency, check)
    else:
        statuses["completed"] = accepted
    for conn in pool:
        await conn.close()
    await control.close()
    return {
        "runs": count,
        "submit_s": submitted_s,
        "all_waiting_s": waiting_s,
        "rss_before": rss_before,
        "rss_waiting": rss_waiting,
        "bytes_per_run": (rss_waiting - rss_before) / count,
        "rest_cpu_pct": rest_cpu_pct,
        "rest_seconds": rest,
        "approve_all_s": window.wall,
        "approve_posts_s": approved_s,
        "accepted": accepted,
        "statuses": statuses,
        "approve_window": window.report(),
    }


# --- idle open streams (scenario 3 beside the peers) -----------------------------------------


async def task_idle_streams(spec: Spec) -> Result:
    """``n`` open SSE streams, each parked after a marker frame: memory per stream."""
    host, port, count = spec["host"], spec["port"], int(spec["streams"])
    method = spec.get("method", "POST")
    path_template: str = spec["path"]
    body_template: str | None = spec.get("body")
    marker: str = spec["marker"]
    probe = ServerProbe(spec["server_pid"])
    tag = _unique()
    await asyncio.sleep(0.5)
    rss_before = probe.rss()
    connections: list[Connection] = []

    async def open_one(index: int) -> None:
        conn = Connection(host, port)
        await conn.connect()
        connections.append(conn)
        name = f"idle-{tag}-{index}"
        path = path_template.replace("{n}", name)
        body = None if body_template is None else body_template.replace("{n}", name).encode()
        conn.send_request(method, path, body)
        response = await conn.read_head()
        if response.status != 200:
            raise RuntimeError(f"stream {index}: {response.status}")
        await _read_until(conn, response, SSEParser(), lambda e: marker in e.data)

    t0 = time.perf_counter()
    await _bounded(range(count), spec.get("concurrency", 32), open_one)
    opened_s = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    rss_open = probe.rss()
    cpu0, w0 = probe.cpu(), time.perf_counter()
    await asyncio.sleep(spec.get("rest_seconds", 3.0))
    rest_cpu_pct = 100 * (probe.cpu() - cpu0) / (time.perf_counter() - w0)
    for conn in connections:
        conn.abort()
    return {
        "streams": count,
        "open_s": opened_s,
        "rss_before": rss_before,
        "rss_open": rss_open,
        "bytes_per_stream": (rss_open - rss_before) / count,
        "rest_cpu_pct": rest_cpu_pct,
    }


# --- scenario 5: overload ---------------------------------------------------------------------


async def task_overload(spec: Spec) -> Result:
    """``clients`` closed-loop clients for ``duration`` s; 429s are retried after a pause."""
    host, port = spec["host"], spec["port"]
    clients: int = spec["clients"]
    duration: float = spec["duration"]
    max_requests: int = spec.get("max_requests", 100_000)
    pause: float = spec.get("retry_pause", 0.02)
    body = json.dumps({"input": spec.get("input", "hello there")}).encode()
    probe = ServerProbe(spec.get("server_pid"))
    tag = _unique()
    rejected: list[float] = []
    retry_after_missing = 0
    admitted_first: list[float] = []
    admitted_head: list[float] = []
    other: dict[str, int] = {}
    sent = 0
    marker = b"event: text.delta"
    stop_at = time.perf_counter() + duration

    async def client(index: int) -> None:
        nonlocal sent, retry_after_missing
        conn = Connection(host, port)
        await conn.connect()
        serial = 0
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            serial += 1
            if not conn.connected:
                await conn.connect()
            t0 = time.perf_counter()
            conn.send_request("POST", f"/v1/sessions/ov-{tag}-{index}-{serial}/runs", body)
            head = await conn.read_head()
            t_head = time.perf_counter() - t0
            if head.status == 429:
                await conn.read_body(head)
                rejected.append(t_head)
                if "retry-after" not in head.headers:
                    retry_after_missing += 1
                await asyncio.sleep(pause)
                continue
            if head.status != 200:
                await conn.read_body(head)
                other[str(head.status)] = other.get(str(head.status), 0) + 1
                continue
            first: float | None = None
            window = b""
            while True:
                data = await conn.read_chunk(head)
                if not data:
                    break
                if first is None:
                    window = (window + data)[-4096:]
                    if marker in window:
                        first = time.perf_counter() - t0
            if first is not None:
                admitted_first.append(first)
                admitted_head.append(t_head)
        await conn.close()

    window = Window(probe)
    window.start()
    await asyncio.gather(*(client(i) for i in range(clients)))
    window.stop()
    return {
        "clients": clients,
        "requests": sent,
        "rejected": summary_ms(rejected),
        "retry_after_missing": retry_after_missing,
        "admitted_ttfe": summary_ms(admitted_first),
        "admitted_head": summary_ms(admitted_head),
        "other_statuses": other,
        # raw durations (s), so the harness can pool several blocks of one phase
        "samples": {"rejected": rejected, "admitted_ttfe": admitted_first},
        **window.report(),
    }


# --- scenario 6: drain --------------------------------------------------------------------------


async def task_drain(spec: Spec) -> Result:
    """``n`` streamed runs in flight, then SIGTERM to the server: who got a terminal event."""
    host, port, count = spec["host"], spec["port"], int(spec["runs"])
    pid: int = spec["server_pid"]
    body = json.dumps({"input": spec["input"]}).encode()
    limit = float(spec.get("time_limit", 120))
    tag = _unique()
    started = 0
    all_started = asyncio.Event()
    outcomes: dict[str, int] = {}
    last_terminal = 0.0
    signalled_at = 0.0
    marker = b"event: text.delta"
    connect_gate = asyncio.Semaphore(64)

    async def one(index: int) -> None:
        nonlocal started, last_terminal
        conn = Connection(host, port)
        outcome = "lost"
        counted = False
        try:
            async with connect_gate:
                await conn.connect()
                conn.send_request("POST", f"/v1/sessions/drain-{tag}-{index}/runs", body)
                head = await conn.read_head()
            if head.status != 200:
                outcome = f"status {head.status}"
                return
            tail = b""
            while True:
                data = await conn.read_chunk(head)
                if not data:
                    break
                tail = (tail + data)[-2048:]
                if not counted and marker in tail:
                    counted = True
                    started += 1
                    if started == count:
                        all_started.set()
            if b"event: run.completed" in tail:
                outcome = "completed"
            elif b"event: run.cancelled" in tail:
                reason = tail.rsplit(b'"reason":"', 1)[-1].split(b'"', 1)[0].decode()
                outcome = f"cancelled:{reason}"
            elif b"event: run.failed" in tail:
                outcome = "failed"
            if outcome != "lost":
                last_terminal = time.perf_counter()
        except (HTTPError, OSError, asyncio.IncompleteReadError):
            outcome = "lost"
        finally:
            if not counted:
                started += 1
                if started == count:
                    all_started.set()
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            await conn.close()

    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    try:
        await asyncio.wait_for(all_started.wait(), limit)
    except TimeoutError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"error": "the runs did not all start in time", "outcomes": outcomes}
    signalled_at = time.perf_counter()
    os.kill(pid, signal.SIGTERM)
    # a run asked for while draining: 503 draining
    late = Connection(host, port)
    late_status: int | str = "refused"
    with contextlib.suppress(HTTPError, OSError):
        answer = await asyncio.wait_for(
            late.request("POST", f"/v1/sessions/drain-{tag}-late/runs", {"input": "late"}), 5
        )
        late_status = answer.status
    await late.close()
    _done, pending = await asyncio.wait(tasks, timeout=limit)
    for task in pending:
        task.cancel()
    exit_s = await _wait_exit(pid, signalled_at, limit)
    return {
        "runs": count,
        "outcomes": outcomes,
        "lost": outcomes.get("lost", 0) + len(pending),
        "last_terminal_s": last_terminal - signalled_at if last_terminal else None,
        "exit_s": exit_s,
        "late_request_status": late_status,
    }


async def _wait_exit(pid: int, since: float, limit: float) -> float | None:
    """Seconds from ``since`` until ``pid`` exited (a zombie counts: it is not our child)."""
    deadline = time.perf_counter() + limit
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return time.perf_counter() - since
    while time.perf_counter() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        await asyncio.sleep(0.01)
    else:
        return None
    return time.perf_counter() - since


# --- LangGraph: interrupted threads (scenario 3 beside the peers) ------------------------------


async def task_lg_interrupts(spec: Spec) -> Result:
    """``n`` LangGraph threads suspended at ``interrupt()``; memory, then resume them all."""
    host, port, count = spec["host"], spec["port"], int(spec["runs"])
    concurrency: int = spec.get("concurrency", 16)
    probe = ServerProbe(spec["server_pid"])
    limit = float(spec.get("time_limit", 300))
    await asyncio.sleep(0.5)
    rss_before = probe.rss()
    pool = await _pool(host, port, concurrency)
    free = list(pool)
    threads: dict[int, str] = {}

    async def start(index: int) -> None:
        conn = free.pop()
        try:
            thread = (await conn.request("POST", "/threads", {})).json()["thread_id"]
            threads[index] = thread
            answer = await conn.request(
                "POST",
                f"/threads/{thread}/runs/wait",
                {"assistant_id": "approval", "input": {"path": f"file{index}"}},
            )
            if answer.status != 200:
                raise RuntimeError(f"thread {index}: {answer.status} {answer.body[:200]!r}")
        finally:
            free.append(conn)

    t0 = time.perf_counter()
    await _bounded(range(count), concurrency, start)
    suspend_s = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    rss_waiting = probe.rss()
    cpu0, w0 = probe.cpu(), time.perf_counter()
    await asyncio.sleep(spec.get("rest_seconds", 3.0))
    rest_cpu_pct = 100 * (probe.cpu() - cpu0) / (time.perf_counter() - w0)
    completed = 0
    deadline = time.perf_counter() + limit

    async def resume(index: int) -> None:
        nonlocal completed
        if time.perf_counter() > deadline:
            return
        conn = free.pop()
        try:
            answer = await conn.request(
                "POST",
                f"/threads/{threads[index]}/runs/wait",
                {"assistant_id": "approval", "command": {"resume": True}},
            )
            if answer.status == 200 and "Deleted" in answer.body.decode(errors="replace"):
                completed += 1
        finally:
            free.append(conn)

    t1 = time.perf_counter()
    await _bounded(range(count), concurrency, resume)
    resume_s = time.perf_counter() - t1
    for conn in pool:
        await conn.close()
    return {
        "runs": count,
        "suspend_s": suspend_s,
        "rss_before": rss_before,
        "rss_waiting": rss_waiting,
        "bytes_per_run": (rss_waiting - rss_before) / count,
        "rest_cpu_pct": rest_cpu_pct,
        "resume_all_s": resume_s,
        "completed": completed,
    }


TASKS: dict[str, Callable[[Spec], Awaitable[Result]]] = {
    "relay": task_relay,
    "ttfe": task_ttfe,
    "confirm": task_confirm,
    "capacity": task_capacity,
    "idle_streams": task_idle_streams,
    "overload": task_overload,
    "drain": task_drain,
    "stream_timing": task_stream_timing,
    "lg_interrupts": task_lg_interrupts,
}


def main() -> None:
    spec: Spec = json.load(sys.stdin)
    task = TASKS[spec["task"]]
    try:
        import uvloop

        runner: Callable[[Awaitable[Result]], Result] = uvloop.run  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        runner = asyncio.run  # type: ignore[assignment]
    started = time.process_time()
    # every task has its own bounds; this one is the last resort against a hung server
    limit = float(spec.get("time_limit", 300)) + 120
    result = runner(asyncio.wait_for(task(spec), limit))
    result["loadgen_cpu_s"] = time.process_time() - started
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
