"""Request bodies that carry media, decoded off the event loop.

A protocol request may hold an image or a document as base64 (a data URL, AG-UI's data
source): bodies of tens of megabytes. ``json.loads`` takes about 6 ms a megabyte, all of it on
the event loop that every stream of the worker shares, so a large body is decoded in a thread
instead. ``OffLoopJSONRoute`` is the route class of the protocols' FastAPI routers: the same
routes, the same errors (FastAPI still turns a decoding failure into its 422), only where the
decoding runs changes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["OFF_LOOP_BYTES", "OffLoopJSONRequest", "OffLoopJSONRoute"]

OFF_LOOP_BYTES = 256 * 1024
"""Bodies above this size are decoded in a thread (below it, the hand-off costs more)."""


class OffLoopJSONRequest(Request):
    """A request whose ``json()`` decodes a large body in a thread."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > OFF_LOOP_BYTES:
                self._json = await asyncio.to_thread(json.loads, body)
            else:
                self._json = json.loads(body)
        return self._json


class OffLoopJSONRoute(APIRoute):
    """An ``APIRoute`` whose body is read through ``OffLoopJSONRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def off_loop(request: Request) -> Response:
            return await handler(OffLoopJSONRequest(request.scope, request.receive))

        return off_loop
