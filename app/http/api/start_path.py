"""The common start of a run, answered without FastAPI's per-request dependency solving.

``POST /v1/sessions/{session_id}/runs`` is the request every streamed answer begins with, and
FastAPI spends more time routing it and solving its parameters (the route's path, body,
caller, services and two headers, re-inspected on every request) than the service spends
admitting the run. This middleware sits just outside FastAPI's router and takes the common
form of that request itself: a JSON body, no ``Idempotency-Key`` or ``Last-Event-ID``. It
parses and validates it the way the route would (``json.loads``, then ``RunRequest``), and
calls the route's own function with the values FastAPI would have passed.

Anything it does not take, it hands on untouched (with the body it read, replayed): another
path or method, another content type, either header, a body that does not parse or validate
(however it fails), a caller the authenticator refuses, a worker still starting. Those
answers are FastAPI's own, so an error is shaped exactly as it would be. The route stays
registered, for them and for the OpenAPI document. What the route function raises is
answered by the app's own exception handlers, as FastAPI's exception middleware would.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.keys import principal_of
from app.http.api.runs import start_run
from app.http.api.schemas import SESSION_ID_PATTERN, RunRequest
from app.http.middleware import read_body, replay

__all__ = ["RunStartMiddleware"]

_PATH = re.compile(r"^/v1/sessions/(" + SESSION_ID_PATTERN.strip("^$") + r")/runs$")
# headers whose presence sends the request the long way (idempotent repeats, resumptions)
_ROUTE_HEADERS = frozenset({b"idempotency-key", b"last-event-id"})


class RunStartMiddleware:
    """Answers a plain ``POST /v1/sessions/{id}/runs`` by calling ``start_run`` directly."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        match = _PATH.match(scope["path"])
        if match is None or not _plain_json(scope):
            await self.app(scope, receive, send)
            return
        try:
            # the body limit outside refuses a larger body first (raising from its receive)
            body = await read_body(receive, scope["app"].state.settings.max_body_bytes)
        except HTTPException as exc:  # that 413
            await (await _handled(Request(scope, receive), exc))(scope, receive, send)
            return
        if body is None:
            return  # the client went away before its request was whole
        receive = replay(body, receive)
        request = Request(scope, receive)
        arguments = await _arguments(request, match.group(1), body)
        if arguments is None:
            await self.app(scope, receive, send)  # the route answers, with its own errors
            return
        try:
            response = await start_run(*arguments)
        except Exception as exc:
            response = await _handled(request, exc)
        await response(scope, receive, send)


def _plain_json(scope: Scope) -> bool:
    """A JSON body, and neither of the headers only the route handles."""
    json_body = False
    for name, value in scope["headers"]:
        if name in _ROUTE_HEADERS:
            return False
        if name == b"content-type":
            json_body = value.partition(b";")[0].strip().lower() == b"application/json"
    return json_body


async def _arguments(request: Request, session_id: str, body: bytes) -> tuple[Any, ...] | None:
    """``start_run``'s arguments as FastAPI would pass them; None when anything would make
    FastAPI answer otherwise (the route then answers)."""
    services = getattr(request.app.state, "services", None)
    if services is None or not body:
        return None
    try:
        parsed = RunRequest.model_validate(json.loads(body))
        principal = await principal_of(request)
    except Exception:  # any of them (not JSON, too deep, invalid, refused): the route answers
        return None
    return session_id, parsed, principal, services, None, None


async def _handled(request: Request, exc: Exception) -> Response:
    """The app's answer to ``exc`` (its exception handlers, looked up as Starlette does)."""
    handlers = request.app.exception_handlers
    for kind in type(exc).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            answer = handler(request, exc)
            if inspect.isawaitable(answer):
                answer = await answer
            assert isinstance(answer, Response)
            return answer
    raise exc
