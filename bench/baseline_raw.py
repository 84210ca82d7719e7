"""The lowest floor: a raw ASGI app, no framework, on the same server stack (uvicorn, uvloop,
httptools).

    BENCH_FRAMES=frames.json uvicorn bench.baseline_raw:app --port 8002

``POST /v1/sessions/{id}/runs`` streams the frames in ``BENCH_FRAMES`` (as
``bench.baseline_sse`` does: ``[id, event, data]`` of one real run of the service), each
encoded once at start and sent as its own ``http.response.body`` message,
``BENCH_FRAME_GAP`` seconds apart after the first. ``GET /readyz`` answers ready. What a
server spends beyond this is the framework's and the application's.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def _load_frames() -> list[bytes]:
    path = os.environ.get("BENCH_FRAMES")
    frames: list[list[str]] = [["1", "run.started", "{}"], ["2", "run.completed", "{}"]]
    if path:
        with open(path, encoding="utf-8") as file:
            frames = json.load(file)
    return [f"id: {i}\nevent: {e}\ndata: {d}\n\n".encode() for i, e, d in frames]


FRAMES = _load_frames()
GAP = float(os.environ.get("BENCH_FRAME_GAP") or 0)
_STREAM_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
]


async def app(
    scope: Scope,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["method"] == "POST" and scope["path"].endswith("/runs"):
        await send({"type": "http.response.start", "status": 200, "headers": _STREAM_HEADERS})
        for index, frame in enumerate(FRAMES):
            if GAP and index:
                await asyncio.sleep(GAP)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"status":"ready"}'
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
