"""The load generator's tasks about runs that wait: a confirmation's round trip, many runs
waiting at once, idle open streams, and LangGraph's interrupted threads beside them.

Part of ``bench.loadgen`` (its ``TASKS`` name them); run through ``python -m bench.loadgen``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from bench.client import Connection, Response, SSEParser
from bench.measure import (
    ServerProbe,
    Window,
    bounded,
    open_pool,
    read_until,
    summary_ms,
    unique_tag,
)

__all__ = ["task_capacity", "task_confirm", "task_idle_streams", "task_lg_interrupts"]

Spec = dict[str, Any]
Result = dict[str, Any]


# --- scenario 4: confirmation round trip ------------------------------------------------------


async def _acknowledged(answers: Connection, t0: float) -> float:
    head = await answers.read_head()
    await answers.read_body(head)
    if head.status != 202:
        raise RuntimeError(f"the answer was not accepted: {head.status} {head.body!r}")
    return time.perf_counter() - t0


async def _arrived(
    follow: Connection, response: Response, parser: SSEParser, event_name: str, t0: float
) -> float:
    await read_until(follow, response, parser, lambda e: e.event == event_name)
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
    tag = unique_tag()
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
            await read_until(follow, response, parser, lambda e: e.event == "ready")
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
            asked = await read_until(
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
            await read_until(follow, response, parser, lambda e: e.event.startswith("run."))
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
    tag = unique_tag()
    control = Connection(host, port)
    state_path = "/state" if baseline else "/debug/state"
    settle: float = spec.get("settle", 1.0)
    await asyncio.sleep(settle / 2)
    rss_before = probe.rss()
    pool = await open_pool(host, port, concurrency)
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
    await bounded(range(count), concurrency, submit)
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
            event = await read_until(
                conn, response, SSEParser(), lambda e: "confirmation_requested" in e.data
            )
            call_ids[index] = json.loads(event.data)["data"]["payload"]["tool_call_id"]
        finally:
            conn.abort()

    if not baseline:
        await bounded(range(count), concurrency, read_call)
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
    await bounded(range(count), concurrency, approve)
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

        await bounded(range(count), concurrency, check)
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
    tag = unique_tag()
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
        await read_until(conn, response, SSEParser(), lambda e: marker in e.data)

    t0 = time.perf_counter()
    await bounded(range(count), spec.get("concurrency", 32), open_one)
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


# --- LangGraph: interrupted threads (scenario 3 beside the peers) ------------------------------


async def task_lg_interrupts(spec: Spec) -> Result:
    """``n`` LangGraph threads suspended at ``interrupt()``; memory, then resume them all."""
    host, port, count = spec["host"], spec["port"], int(spec["runs"])
    concurrency: int = spec.get("concurrency", 16)
    probe = ServerProbe(spec["server_pid"])
    limit = float(spec.get("time_limit", 300))
    await asyncio.sleep(0.5)
    rss_before = probe.rss()
    pool = await open_pool(host, port, concurrency)
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
    await bounded(range(count), concurrency, start)
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
    await bounded(range(count), concurrency, resume)
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
