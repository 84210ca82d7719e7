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
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psutil

from bench.client import Connection, FrameCounter, HTTPError
from bench.loadgen_waiting import task_capacity, task_confirm, task_idle_streams, task_lg_interrupts
from bench.measure import ServerProbe, Window, open_pool, percentile, summary_ms, unique_tag

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam as MessageParam

__all__ = ["TASKS", "main"]

Spec = dict[str, Any]
Result = dict[str, Any]


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
    tag = unique_tag()
    probe = ServerProbe(spec.get("server_pid"))
    headers = spec.get("headers")

    def request_for(client: int, index: int) -> tuple[str, bytes | None]:
        name = f"{tag}-{client}-{index}"
        # {client}: the same for every run of one client (its turns of one conversation)
        path = path_template.replace("{n}", name).replace("{client}", f"{tag}-{client}")
        body = None if body_template is None else body_template.replace("{n}", name).encode()
        return path, body

    # warm-up: one run on its own connection, not counted
    warm = Connection(host, port)
    path, body = request_for(-1, 0)
    warmup = await _stream_once(warm, method, path, body, ok_marker, None, headers)
    await warm.close()
    if not warmup["ok"]:
        return {"error": f"warm-up run failed: {warmup}"}
    connections = await open_pool(host, port, concurrency)
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
    tag = unique_tag()
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


# --- scenario 13: time to first event of a run carrying an image ---------------------------

IMAGE_PATHS = (
    "direct_text",
    "direct_image",
    "service_text",
    "service_file_id",
    "service_data_url",
    "service_data_url_new",
)
"""The paths of ``task_ttfe_image``, in the order of its first round."""


def _data_url(image: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(image).decode()


def _text_part(spec: Spec) -> dict[str, str]:
    return {"type": "text", "text": spec.get("input", "What is in this picture?")}


def _image_bodies(spec: Spec) -> tuple[dict[str, bytes], dict[str, list[MessageParam]]]:
    """The service's request bodies and the direct calls' messages, by path."""
    from bench.uploads import _png

    text_part = _text_part(spec)
    text: str = text_part["text"]
    data_url = _data_url(_png(spec["image_bytes"], spec["seed"]))
    file_part = {"type": "image", "file_id": spec["file_id"]}
    url_part = {"type": "image", "url": data_url}
    bodies = {
        "service_text": json.dumps({"input": [text_part]}).encode(),
        "service_file_id": json.dumps({"input": [text_part, file_part]}).encode(),
        "service_data_url": json.dumps({"input": [text_part, url_part]}).encode(),
    }
    messages: dict[str, list[MessageParam]] = {
        "direct_text": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "direct_image": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {"type": "image_url", "image_url": {"url": data_url}},
                ],
            }
        ],
    }
    return bodies, messages


async def task_ttfe_image(spec: Spec) -> Result:
    """Sequential requests, rotating over ``IMAGE_PATHS``: the upstream called directly with
    the OpenAI SDK (text only, and with the image as a ``data:`` URL), and the service (text
    only, the image by ``file_id``, the image as a ``data:`` URL of the same content, and as
    one of a new content each round: stored, not deduplicated). Each path's time to first
    event, in seconds, round by round."""
    import openai

    from bench.uploads import _png

    host, port = spec["host"], spec["port"]
    count: int = spec["requests"]
    warmup: int = spec.get("warmup", 30)
    deadline = time.perf_counter() + float(spec.get("time_limit", 300))
    client = openai.AsyncOpenAI(
        base_url=spec["upstream_url"], api_key="bench", max_retries=0, timeout=60
    )
    bodies, messages = _image_bodies(spec)
    text_part = _text_part(spec)
    conn = Connection(host, port)
    await conn.connect()
    tag = unique_tag()

    async def direct(name: str) -> float:
        start = time.perf_counter()
        stream = await client.chat.completions.create(
            model=spec["model"], messages=messages[name], stream=True
        )
        first = float("nan")
        async for chunk in stream:
            if first != first and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
        if first != first:
            raise RuntimeError(f"the direct call ({name}) streamed no content")
        return first

    async def service(name: str, body: bytes, index: int) -> float:
        path = f"/v1/sessions/img-{tag}-{index}-{IMAGE_PATHS.index(name)}/runs"
        result = await _stream_once(
            conn, "POST", path, body, b"run.completed", b"event: text.delta"
        )
        if not result["ok"] or result["first"] is None:
            raise RuntimeError(f"a run through the service ({name}) failed: {result}")
        return float(result["first"])

    samples: dict[str, list[float]] = {name: [] for name in IMAGE_PATHS}
    rounds = done = 0
    for index in range(warmup + count):
        if time.perf_counter() > deadline:
            break
        # a new content each round (none is the fixed image's), built before any clock starts
        image = _png(spec["image_bytes"], spec["seed"] + 1 + index % 250)
        fresh = {"type": "image", "url": _data_url(image)}
        bodies["service_data_url_new"] = json.dumps({"input": [text_part, fresh]}).encode()
        # rotate the order, so that no path always follows the same other one
        shift = index % len(IMAGE_PATHS)
        measured: dict[str, float] = {}
        for name in IMAGE_PATHS[shift:] + IMAGE_PATHS[:shift]:
            if name.startswith("direct"):
                measured[name] = await direct(name)
            else:
                measured[name] = await service(name, bodies[name], index)
        done += 1
        if index >= warmup:
            rounds += 1
            for name, value in measured.items():
                samples[name].append(value)
    await conn.close()
    await client.close()
    # rounds: measured; done: measured and warm-up alike
    return {"rounds": rounds, "done": done, "warmup": warmup, "samples": samples}


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
    tag = unique_tag()
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
    tag = unique_tag()
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
    tag = unique_tag()
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


TASKS: dict[str, Callable[[Spec], Awaitable[Result]]] = {
    "relay": task_relay,
    "ttfe": task_ttfe,
    "ttfe_image": task_ttfe_image,
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
