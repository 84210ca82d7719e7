"""The floor: a minimal sse-starlette app on the same server stack (uvicorn, uvloop, httptools).

    BENCH_FRAMES=frames.json uvicorn bench.baseline_sse:app --port 8001

It does the least an SSE server can do for each scenario, so that a ratio against it is the
service's own cost:

- ``POST /v1/sessions/{id}/runs`` streams the frames in ``BENCH_FRAMES`` (a JSON list of
  ``[id, event, data]`` captured from one real run of the service: the same ids, event names
  and JSON sizes), one ``ServerSentEvent`` per frame, with no run, storage or JSON encoding;
  ``BENCH_FRAME_GAP`` seconds apart after the first (the demo model's token delay: one write
  per frame);
- ``GET /wait/{key}`` streams ``ready``, waits until ``POST /signal/{key}``, then streams
  ``signalled`` and ends (the floor of a confirmation round trip);
- ``POST /park/{key}`` starts a task awaiting a future until ``POST /unpark/{key}`` (the floor
  of a run waiting for an answer); ``GET /state`` counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["app"]


def _load_frames() -> list[tuple[str, str, str]]:
    path = os.environ.get("BENCH_FRAMES")
    if not path:
        return [("1", "run.started", "{}"), ("2", "run.completed", "{}")]
    with open(path, encoding="utf-8") as file:
        return [(str(i), str(e), str(d)) for i, e, d in json.load(file)]


FRAMES = _load_frames()
GAP = float(os.environ.get("BENCH_FRAME_GAP") or 0)
_signals: dict[str, asyncio.Event] = {}
_parked: dict[str, asyncio.Future[None]] = {}
_tasks: set[asyncio.Task[None]] = set()


async def stream_run(request: Request) -> Response:
    await request.body()

    async def frames() -> AsyncIterator[ServerSentEvent]:
        for index, (ident, event, data) in enumerate(FRAMES):
            if GAP and index:
                await asyncio.sleep(GAP)
            yield ServerSentEvent(data=data, event=event, id=ident, sep="\n")

    return EventSourceResponse(frames(), sep="\n", headers={"cache-control": "no-store"})


async def wait(request: Request) -> Response:
    key = request.path_params["key"]
    signal = _signals.setdefault(key, asyncio.Event())

    async def frames() -> AsyncIterator[ServerSentEvent]:
        try:
            yield ServerSentEvent(data='{"ready":true}', event="ready", id="1", sep="\n")
            await signal.wait()
            yield ServerSentEvent(data='{"signalled":true}', event="signalled", id="2", sep="\n")
        finally:
            _signals.pop(key, None)

    return EventSourceResponse(frames(), sep="\n")


async def signal(request: Request) -> Response:
    await request.body()
    event = _signals.get(request.path_params["key"])
    if event is None:
        return JSONResponse({"accepted_by": []}, status_code=409)
    event.set()
    return JSONResponse({"accepted_by": ["baseline"]}, status_code=202)


async def _parked_run(future: asyncio.Future[None]) -> None:
    await future


async def park(request: Request) -> Response:
    key = request.path_params["key"]
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _parked[key] = future
    task = asyncio.get_running_loop().create_task(_parked_run(future))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return JSONResponse({"run_id": key, "status": "waiting"}, status_code=202)


async def unpark(request: Request) -> Response:
    future = _parked.pop(request.path_params["key"], None)
    if future is None:
        return JSONResponse({"accepted_by": []}, status_code=409)
    future.set_result(None)
    return JSONResponse({"accepted_by": ["baseline"]}, status_code=202)


async def state(request: Request) -> Response:
    return JSONResponse({"parked": len(_parked), "tasks": len(_tasks)})


async def ready(request: Request) -> Response:
    return JSONResponse({"status": "ready"})


routes: list[Any] = [
    Route("/v1/sessions/{session_id}/runs", stream_run, methods=["POST"]),
    Route("/wait/{key}", wait),
    Route("/signal/{key}", signal, methods=["POST"]),
    Route("/park/{key}", park, methods=["POST"]),
    Route("/unpark/{key}", unpark, methods=["POST"]),
    Route("/state", state),
    Route("/readyz", ready),
]
app = Starlette(routes=routes)
