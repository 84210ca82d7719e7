"""Request bodies that carry media, decoded without holding the event loop.

A protocol request may hold an image or a document as base64 (a data URL, AG-UI's data
source): bodies of tens of megabytes. ``json.loads`` holds the GIL over a whole string, a
tenth of a second for 20 MB even in a thread, so a large body is read with its base64 strings
set aside (``app.http.body_media.loads``), in a thread. ``OffLoopJSONRoute`` is the route class
of the protocols' FastAPI routers: the same routes, the same errors (FastAPI still turns a
decoding failure into its 422), only how the decoding runs changes.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from app.http import body_media

__all__ = ["OFF_LOOP_BYTES", "OffLoopJSONRequest", "OffLoopJSONRoute"]

OFF_LOOP_BYTES = 256 * 1024
"""Bodies above this size are decoded in a thread (below it, the hand-off costs more)."""

# the protocols name raw base64 too (AG-UI's data source ``value``, the draft's ``data``)
_loads = functools.partial(body_media.loads, raw_keys=True)


class OffLoopJSONRequest(Request):
    """A request whose ``json()`` decodes a large body in a thread, its media set aside."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > OFF_LOOP_BYTES:
                self._json = await asyncio.to_thread(_loads, body)
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
