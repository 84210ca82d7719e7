"""ASGI middleware of the service: the request body limit."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import problem_response

__all__ = ["BodyLimitMiddleware", "BodyTooLarge"]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the limit.

    An ``HTTPException`` on purpose: FastAPI turns other exceptions raised while it reads a
    body into 400, but passes this one to the 413 handler.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class BodyLimitMiddleware:
    """413 ``payload_too_large`` for a body over ``limit`` bytes.

    A declared ``Content-Length`` over the limit is refused before reading; a body without
    one (chunked) is counted as it arrives and refused as soon as it passes the limit.
    """

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    response = problem_response(
                        413, "payload_too_large", f"the request body is larger than {limit} bytes"
                    )
                    await response(scope, receive, send)
                    return
                break
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        try:
            await self.app(scope, counting_receive, send)
        except BodyTooLarge:
            # raised where no handler could answer it (outside a route's body parsing)
            response = problem_response(
                413, "payload_too_large", f"the request body is larger than {limit} bytes"
            )
            await response(scope, receive, send)
