"""Every error the service answers is ``application/problem+json`` (RFC 9457).

``{"type", "title", "status", "detail", "code"}``; ``code`` is a stable public literal. The
service raises ``ProblemError`` (or a subclass) anywhere below a route; FastAPI's own errors
(validation, unknown route, wrong method) and unexpected exceptions are mapped here too, so
no answer ever carries a traceback.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.bus.base import BusUnavailable
from app.errors import ServiceError
from app.storage.base import StorageUnavailable

__all__ = [
    "OPENAI_PREFIX",
    "PROBLEM_CONTENT_TYPE",
    "ProblemError",
    "install_error_handlers",
    "openai_error_body",
    "openai_error_response",
    "problem_body",
    "problem_response",
    "service_problem",
    "status_of",
]

logger = logging.getLogger("app.errors")

PROBLEM_CONTENT_TYPE = "application/problem+json"

_TITLES: dict[str, str] = {
    "session_busy": "Session busy",
    "overloaded": "Overloaded",
    "draining": "Draining",
    "not_found": "Not found",
    "unauthorized": "Unauthorized",
    "payload_too_large": "Payload too large",
    "unsupported_media_type": "Unsupported media type",
    "validation_error": "Validation error",
    "not_accepted": "Not accepted",
    "method_not_allowed": "Method not allowed",
    "bad_request": "Bad request",
    "unavailable": "Service unavailable",
    "starting": "Starting",
    "internal": "Internal error",
}

_CODE_BY_STATUS: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    409: "session_busy",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "overloaded",
    503: "unavailable",
}


# the HTTP status of each domain error code (app.errors)
_STATUS_BY_CODE: dict[str, int] = {
    "not_found": 404,
    "validation_error": 422,
    "idempotency_key_reused": 422,
    "webhook_url_refused": 422,
    "invalid_cron": 422,
    "unknown_timezone": 422,
    "cron_too_frequent": 422,
    "cron_never_fires": 422,
    "too_many_schedules": 422,
    "schedule_in_past": 422,
    "schedule_timing": 422,
    "unknown_agent": 422,
    "unauthorized": 401,
    "session_busy": 409,
    "not_accepted": 409,
    "conflict": 409,
    "turn_not_latest": 409,
    "file_in_use": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "empty_file": 422,
    "malformed_file": 422,
    # a run's input parts (app.files.intake)
    "file_not_found": 404,
    "input_too_large": 413,
    "too_many_parts": 422,
    "empty_input": 422,
    "invalid_data_url": 422,
    "unsupported_url": 422,
    "idempotency_key_in_flight": 409,
    "confirmation_required": 409,
    "approval_pending": 409,
    "overloaded": 429,
    "budget_exceeded": 429,
    "draining": 503,
    "unavailable": 503,
    "agent_unavailable": 503,
    "provider_error": 502,
}

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="agent-server"'}


def status_of(exc: ServiceError) -> int:
    """The HTTP status that answers a domain error: its code's, else its class's (a finer
    code, such as ``InvalidRequest(..., code="answer_not_allowed")``, keeps the status of
    its kind of error)."""
    status = _STATUS_BY_CODE.get(exc.code)
    if status is None:
        status = _STATUS_BY_CODE.get(type(exc).code, 500)
    return status


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds, never 0 for a positive wait."""
    return str(max(0, math.ceil(seconds)))


class ProblemError(Exception):
    """An error answer: raise it from a route or a dependency.

    ``extra`` adds members to the problem object (``active_run_id``, ``accepted_by``...);
    ``headers`` adds response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def response(self, path: str | None = None) -> Response:
        """The problem as a response (in the shape ``path``'s clients read)."""
        return problem_response(
            self.status, self.code, self.detail, headers=self.headers, extra=self.extra, path=path
        )

    @classmethod
    def of(cls, exc: ServiceError) -> ProblemError:
        """The problem answering a domain error."""
        headers: dict[str, str] = {}
        if exc.retry_after is not None:
            headers["Retry-After"] = retry_after_header(exc.retry_after)
        if exc.code == "unauthorized":
            headers.update(_CHALLENGE)
        return cls(status_of(exc), exc.code, exc.detail, headers=headers, extra=exc.extra)


def service_problem(exc: ServiceError, path: str | None = None) -> Response:
    """The response answering a domain error (problem+json, or ``path``'s own shape)."""
    return ProblemError.of(exc).response(path)


def problem_body(
    status: int, code: str, detail: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The problem object."""
    body: dict[str, Any] = {
        "type": f"urn:agent-runtime:problem:{code}",
        "title": _TITLES.get(code, code.replace("_", " ").capitalize()),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if extra:
        body.update(extra)
    return body


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    path: str | None = None,
) -> Response:
    """A problem+json response; under ``/openai/``, the OpenAI error shape instead, and
    under ``/langgraph/`` LangGraph's (``{"detail"}``, with our ``code`` beside it)."""
    if path is not None and path.startswith(OPENAI_PREFIX):
        return openai_error_response(status, code, detail, headers=headers)
    if path is not None and path.startswith(LANGGRAPH_PREFIX):
        return JSONResponse(
            {"detail": detail, "code": code}, status_code=status, headers=dict(headers or {})
        )
    return JSONResponse(
        problem_body(status, code, detail, extra),
        status_code=status,
        headers=dict(headers or {}),
        media_type=PROBLEM_CONTENT_TYPE,
    )


OPENAI_PREFIX = "/openai/"
LANGGRAPH_PREFIX = "/langgraph/"

# the OpenAI error ``type`` of each status, as the OpenAI API itself answers them
_OPENAI_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_body(status: int, code: str, detail: str) -> dict[str, Any]:
    """``{"error": {...}}`` as the OpenAI API answers an error."""
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": detail, "type": kind, "code": code, "param": None}}


def openai_error_response(
    status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None
) -> Response:
    """An error in the OpenAI shape (the ``/openai/v1`` endpoints)."""
    return JSONResponse(
        openai_error_body(status, code, detail), status_code=status, headers=dict(headers or {})
    )


def _location(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return exc.response(request.url.path)


async def _on_service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return service_problem(exc, request.url.path)


async def _on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, _UNREADABLE_JSON):
        # FastAPI's 400 for a JSON body its parser gave up on: malformed JSON, like any other
        return _unreadable_json(exc.__cause__, request.url.path)
    code = _CODE_BY_STATUS.get(exc.status_code, "internal" if exc.status_code >= 500 else "error")
    if exc.status_code == 404:
        detail = f"nothing is served at {request.url.path}"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
        headers = {**(exc.headers or {}), "Allow": _allowed_methods(request)}
        return problem_response(
            exc.status_code, code, detail, headers=headers, path=request.url.path
        )
    else:
        detail = str(exc.detail)
    return problem_response(
        exc.status_code, code, detail, headers=exc.headers, path=request.url.path
    )


# what json.loads raises, besides JSONDecodeError, for a body it cannot read: bytes that are not
# UTF-8, nesting deeper than the interpreter's recursion limit, an integer of over 4300 digits
_UNREADABLE_JSON = (UnicodeDecodeError, RecursionError, ValueError)


def _unreadable_json(cause: BaseException, path: str) -> Response:
    if isinstance(cause, UnicodeDecodeError):
        why = "it is not UTF-8"
    elif isinstance(cause, RecursionError):
        why = "it is nested too deeply"
    else:
        why = "it holds a number too long to read"
    return problem_response(
        422,
        "validation_error",
        f"body: the request body is not valid JSON ({why})",
        extra={"errors": [{"loc": ["body"], "msg": why, "type": "json_invalid"}]},
        path=path,
    )


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route takes at this path (Starlette names only the first route's).

    Asked of the routes themselves, method by method: included routers nest theirs. Mounts
    (the UI's files) are left out: they take any path.
    """
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]
    return ", ".join(allowed)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    # only location, message and type: pydantic's "input" would echo the request (a prompt)
    errors = [
        {"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "")), "type": err.get("type")}
        for err in exc.errors()
    ]
    if errors:
        first = errors[0]
        detail = f"{_location(first['loc'])}: {first['msg']}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
    else:  # pragma: no cover - pydantic always reports at least one error
        detail = "the request is not valid"
    return problem_response(
        422, "validation_error", detail, extra={"errors": errors}, path=request.url.path
    )


async def _on_storage_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("storage unavailable: %s", exc)
    return problem_response(
        503,
        "unavailable",
        "the database cannot be reached right now; retry shortly",
        headers={"Retry-After": "2"},
        path=request.url.path,
    )


async def _on_bus_unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("bus unavailable: %s", exc)
    return problem_response(
        503,
        "unavailable",
        "the shared event bus (Redis) cannot be reached right now; retry shortly",
        headers={"Retry-After": "2"},
        path=request.url.path,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to problem+json."""
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(StorageUnavailable, _on_storage_unavailable)
    app.add_exception_handler(BusUnavailable, _on_bus_unavailable)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)


class CatchAllMiddleware:
    """Innermost guard: an unexpected exception becomes a 500 ``internal`` problem.

    Starlette's ServerErrorMiddleware would answer too, but then re-raise (the server logs the
    traceback twice) and its answer is plain text. The exception is logged here, once, and
    the client gets no traceback.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            logger.exception(
                "unhandled error answering %s %s", scope.get("method"), scope.get("path")
            )
            if started:
                # the answer is under way: all that is left is to end it
                return
            response = problem_response(
                500,
                "internal",
                "the server failed to answer this request; it was logged",
                path=scope.get("path"),
            )
            await response(scope, receive, send)
