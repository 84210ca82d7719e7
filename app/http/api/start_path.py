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

A body over ``AGENT_MAX_BODY_BYTES`` (a run start may carry images and documents as base64
data URLs, up to ``app.http.middleware.body_limit``) is never handed on: FastAPI would parse
it on the event loop, which tens of megabytes of JSON would hold up for a good part of a
second. This middleware takes it whatever its headers, parses and validates it in a thread,
and answers its errors itself, in the shape FastAPI's would have (``RequestValidationError``
through the app's handler).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.keys import principal_of
from app.errors import Unavailable, UnsupportedMediaType
from app.http import body_media
from app.http.api.runs import start_run
from app.http.api.schemas import SESSION_ID_PATTERN, SESSION_ID_RULE, RunRequest
from app.http.middleware import body_limit, read_body, replay

__all__ = ["RunStartMiddleware"]

_PATH = re.compile(r"^/v1/sessions/(" + SESSION_ID_PATTERN.strip("^$") + r")/runs$")
# headers whose presence sends the request the long way (idempotent repeats, resumptions)
_ROUTE_HEADERS = frozenset({b"idempotency-key", b"last-event-id"})


class RunStartMiddleware:
    """Answers a plain ``POST /v1/sessions/{id}/runs`` (and any whose body is large) by
    calling ``start_run`` directly."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        match = _PATH.match(scope["path"])
        if match is None or not _plain_json(scope):
            if _large_elsewhere(scope):
                await self._elsewhere(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        settings = scope["app"].state.settings
        try:
            # the body limit outside refuses a larger body first (raising from its receive)
            body = await read_body(receive, body_limit(settings, scope["path"]))
        except HTTPException as exc:  # that 413
            await (await _handled(Request(scope, receive), exc))(scope, receive, send)
            return
        if body is None:
            return  # the client went away before its request was whole
        receive = replay(body, receive)
        request = Request(scope, receive)
        if len(body) > settings.max_body_bytes:
            await (await _large(request, match.group(1), body))(scope, receive, send)
            return
        routed = any(name in _ROUTE_HEADERS for name, _ in scope["headers"])
        arguments = None if routed else await _arguments(request, match.group(1), body)
        if arguments is None:
            await self.app(scope, receive, send)  # the route answers, with its own errors
            return
        try:
            response = await start_run(*arguments)
        except Exception as exc:
            response = await _handled(request, exc)
        await response(scope, receive, send)

    async def _elsewhere(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A run start this middleware does not take: a small body goes on to the route; a
        large one is answered here (415 if it is not JSON, 422 for the session id), so that
        FastAPI never parses it on the loop."""
        settings = scope["app"].state.settings
        try:
            body = await read_body(receive, body_limit(settings, scope["path"]))
        except HTTPException as exc:  # the 413 of the body limit outside
            await (await _handled(Request(scope, receive), exc))(scope, receive, send)
            return
        if body is None:
            return  # the client went away
        receive = replay(body, receive)
        if len(body) <= settings.max_body_bytes:
            await self.app(scope, receive, send)
            return
        problem: Exception
        if not _json_type(scope):
            problem = UnsupportedMediaType(
                f"a run start's body over {settings.max_body_bytes} bytes (one with images or "
                "documents in it) is JSON: send Content-Type: application/json"
            )
        else:
            problem = _invalid("path", "session_id", SESSION_ID_RULE, "string_pattern_mismatch")
        request = Request(scope, receive)
        await (await _handled(request, problem))(scope, receive, send)


def _json_type(scope: Scope) -> bool:
    """A JSON body (``Content-Type: application/json``)."""
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.partition(b";")[0].strip().lower() == b"application/json"
    return False


def _plain_json(scope: Scope) -> bool:
    """A JSON body, and neither of the headers only the route handles (unless the body is
    larger than the route may parse: see ``_large``)."""
    if not _json_type(scope):
        return False
    return not any(name in _ROUTE_HEADERS for name, _ in scope["headers"]) or _maybe_large(scope)


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _maybe_large(scope: Scope) -> bool:
    """Whether the body may pass ``AGENT_MAX_BODY_BYTES`` (a chunked one may)."""
    declared = _declared_length(scope)
    limit: int = scope["app"].state.settings.max_body_bytes
    return declared is None or declared > limit


def _large_elsewhere(scope: Scope) -> bool:
    """A POST to a run start path this middleware does not take (a session id out of shape,
    a body that is not JSON) whose body may pass ``AGENT_MAX_BODY_BYTES``."""
    path = scope["path"]
    if not (path.startswith("/v1/sessions/") and path.endswith("/runs")):
        return False
    return path.count("/") == 4 and _maybe_large(scope)


def _invalid(where: str, name: str, msg: str, kind: str) -> RequestValidationError:
    """The validation error FastAPI raises for a bad ``name`` in ``where``."""
    return RequestValidationError([{"loc": (where, name), "msg": msg, "type": kind}])


_IDEMPOTENCY_KEY = re.compile(r"^[ -~]{1,255}$")
_LAST_EVENT_ID = re.compile(r"^\s*[0-9]{0,18}\s*$")


async def _large(request: Request, session_id: str, body: bytes) -> Response:
    """The answer to a run start whose body is over ``AGENT_MAX_BODY_BYTES``: the caller is
    authenticated first, then the body is parsed and validated in a thread, and the route
    called with the headers it takes (checked as the route's own parameters are)."""
    services = getattr(request.app.state, "services", None)
    try:
        if services is None:
            raise Unavailable("the server is starting", retry_after=1)
        principal = await principal_of(request)
        headers = request.headers
        idempotency_key = headers.get("idempotency-key")
        if idempotency_key is not None and not _IDEMPOTENCY_KEY.match(idempotency_key):
            raise _invalid(
                "header",
                "Idempotency-Key",
                "up to 255 printable ASCII characters",
                "string_pattern_mismatch",
            )
        last_event_id = headers.get("last-event-id")
        if last_event_id is not None and not _LAST_EVENT_ID.match(last_event_id):
            raise _invalid("header", "Last-Event-ID", "a seq (digits)", "string_pattern_mismatch")
        parsed = await asyncio.to_thread(_parse, body)
        return await start_run(
            session_id, parsed, principal, services, idempotency_key, last_event_id
        )
    except Exception as exc:
        return await _handled(request, exc)


def _parse(body: bytes) -> RunRequest:
    """The body as ``RunRequest`` (in a thread); ``RequestValidationError`` as FastAPI's."""
    try:
        data = body_media.loads(body)  # its data URLs read around the parser
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number too long
        raise RequestValidationError(
            [{"loc": ("body",), "msg": f"JSON decode error: {exc}"[:200], "type": "json_invalid"}]
        ) from None
    except RecursionError:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": "nested too deeply", "type": "json_invalid"}]
        ) from None
    try:
        return RunRequest.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        ) from None


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
