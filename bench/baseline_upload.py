"""The floor of an upload: a minimal Starlette app on the same server stack (uvicorn, uvloop,
httptools) that reads a request's body as it arrives and drops it.

    uvicorn bench.baseline_upload:app --port 8001

``POST /v1/files`` answers the body's length; ``GET /v1/files/{size}/content`` answers ``size``
bytes prepared at start (the floor of a download); ``GET /readyz`` answers 200. What the
service does beyond this (multipart framing, the staged file, the hash and the checks, the
store) is its own cost.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["app"]

_PREPARED: dict[int, bytes] = {}


async def upload(request: Request) -> Response:
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
    return JSONResponse({"bytes": size}, status_code=201)


async def content(request: Request) -> Response:
    size = int(request.path_params["size"])
    data = _PREPARED.get(size)
    if data is None:
        data = _PREPARED[size] = bytes(size)
    return Response(data, media_type="application/octet-stream")


async def ready(request: Request) -> Response:
    return Response(status_code=200)


app = Starlette(
    routes=[
        Route("/v1/files", upload, methods=["POST"]),
        Route("/v1/files/{size:int}/content", content),
        Route("/readyz", ready),
    ]
)
