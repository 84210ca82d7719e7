"""ASGI middleware of the service: the request body limit, and load shedding."""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import ServiceError, Unauthorized
from app.files.intake import run_body_limit
from app.http.api.errors import ProblemError, problem_response
from app.http.body_media import media_size
from app.settings import Settings

__all__ = [
    "BodyLimitMiddleware",
    "BodyTooLarge",
    "LoadShedMiddleware",
    "body_limit",
    "read_body",
    "replay",
    "takes_media",
    "upload_body_limit",
]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

UPLOAD_PATH: Final = "/v1/files"
"""Where files are uploaded: its body is a file of up to ``AGENT_MAX_FILE_BYTES`` and the
multipart framing around it (``upload_body_limit``), not ``AGENT_MAX_BODY_BYTES``."""
# the framing of an upload: boundaries, the part's headers (a long file name), small fields
_UPLOAD_FRAMING_BYTES: Final = 65536


def upload_body_limit(max_file_bytes: int) -> int:
    """The most a body POSTed to ``UPLOAD_PATH`` may be: the file, and its framing."""
    return max_file_bytes + _UPLOAD_FRAMING_BYTES


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
    one (chunked) is counted as it arrives and refused as soon as it passes the limit. An
    upload (``UPLOAD_PATH``) has the limit of a file instead (``upload_body_limit``).

    A run start (``takes_media``) may carry images and documents as base64 beside it, up to
    ``body_limit`` bytes in all: such a body, when it may pass ``limit``, is read whole
    (refused as soon as it passes ``body_limit``), and refused unless what is not base64
    media in it (``app.http.body_media.media_size``) is within ``limit``.
    """

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        limit = self.limit
        if scope["path"] == UPLOAD_PATH and scope["method"] == "POST":
            limit = max(limit, upload_body_limit(scope["app"].state.settings.max_file_bytes))
        hard = limit
        if scope["method"] == "POST" and takes_media(scope["path"]):
            hard = max(limit, body_limit(scope["app"].state.settings, scope["path"]))
        media = hard > limit
        declared: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > hard:
                    await _too_large(scope, receive, send, hard)
                    return
                break
        if media and (declared is None or declared > limit):
            await self._with_media(scope, receive, send, hard)
            return
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
            await _too_large(scope, receive, send, limit)

    async def _with_media(self, scope: Scope, receive: Receive, send: Send, hard: int) -> None:
        """A run start's body that may pass ``limit``: read whole (up to ``hard``), and handed
        on unless what is not media in it passes ``limit``. That is measured as it arrives
        (each time the body doubles past ``limit``, so the cost stays that of one pass) and
        refused as soon as it passes, as a body without media would be."""
        limit = self.limit
        raw = not _native_run(scope["path"])  # the protocols name raw base64 fields
        chunks: list[bytes] = []
        size = 0
        check_at = limit
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before its request was whole
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > hard:
                await _too_large(scope, receive, send, hard)
                return
            chunks.append(chunk)
            whole = not message.get("more_body", False)
            if size > check_at or (whole and size > limit):
                body = b"".join(chunks)
                chunks = [body]
                media = await asyncio.to_thread(media_size, body, raw_keys=raw, partial=not whole)
                if size - media > limit:
                    await _too_large(scope, receive, send, limit, media=True)
                    return
                check_at = max(check_at, size) * 2
            if whole:
                break
        await self.app(scope, replay(b"".join(chunks), receive), send)


async def _too_large(
    scope: Scope, receive: Receive, send: Send, limit: int, *, media: bool = False
) -> None:
    detail = f"the request body is larger than {limit} bytes"
    if media:
        detail += " (not counting images and documents in it as base64)"
    response = problem_response(413, "payload_too_large", detail, path=scope["path"])
    await response(scope, receive, send)


def _native_run(path: str) -> bool:
    return path.startswith("/v1/sessions/") and path.endswith("/runs") and path.count("/") == 4


def takes_media(path: str) -> bool:
    """Whether a POST to ``path`` starts a run whose body may carry base64 media (the native
    run start, and the protocols' run starts: A2A's JSON-RPC endpoint among them, whose
    method is in the body)."""
    return _starts_run(path) or _answer_marker(path) is not None or _a2a_jsonrpc(path)


def _a2a_jsonrpc(path: str) -> bool:
    """``/a2a/{agent}``: A2A's JSON-RPC endpoint."""
    return path.startswith("/a2a/") and path.count("/") == 2 and len(path) > 5


def body_limit(settings: Settings, path: str) -> int:
    """The most a body POSTed to ``path`` may be: ``AGENT_MAX_BODY_BYTES``, and for a run
    start the base64 of ``AGENT_MAX_FILE_BYTES`` of media beside it."""
    if takes_media(path):
        return run_body_limit(settings.max_body_bytes, settings.max_file_bytes)
    return settings.max_body_bytes


class LoadShedMiddleware:
    """429 ``overloaded`` for a new run while this worker is full, before the request is parsed.

    Under overload most requests are refused. Answering them here (no routing, no body
    parsing, no validation) keeps their cost off the runs that were admitted, which share
    this event loop. A request it cannot decide on (another path, a key that does not
    authenticate, a worker not full or draining) goes on as usual and gets the same answers
    as ever; one refused here gets the very answer ``RunManager.start`` would give.

    The protocols' paths (AG-UI, the AI SDK's chat) also carry answers to waiting runs, which
    free capacity rather than take it: there, a refusal reads the body first and lets an
    answer through.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if _starts_run(path):
                problem = _refusal(scope)
                if problem is not None:
                    await problem.response(path)(scope, receive, send)
                    return
            elif (marker := _answer_marker(path)) is not None and _full(scope):
                # only a full worker reads the body here, to tell a start from an answer
                body = await read_body(receive, body_limit(scope["app"].state.settings, path))
                if body is None:
                    return  # the client went away
                receive = replay(body, receive)
                if marker not in body:
                    problem = _refusal(scope)
                    if problem is not None:
                        await problem.response(path)(scope, receive, send)
                        return
        await self.app(scope, receive, send)


# POST paths that always start a run, besides /v1/sessions/{session_id}/runs
_RUN_STARTS = frozenset({"/openai/v1/responses", "/openai/v1/chat/completions"})


# A2A HTTP+JSON: /a2a/{agent}/message:send and /message:stream (JSON-RPC names its method in
# the body, which is not read here: RunManager.start refuses those with the same 429)
_A2A_RUN_STARTS = ("/message:send", "/message:stream")


def _starts_run(path: str) -> bool:
    if path in _RUN_STARTS:
        return True
    if path.startswith("/a2a/") and path.endswith(_A2A_RUN_STARTS) and path.count("/") == 3:
        return True
    # /v1/sessions/{session_id}/runs
    return path.startswith("/v1/sessions/") and path.endswith("/runs") and path.count("/") == 4


def _answer_marker(path: str) -> bytes | None:
    """For a protocol path that starts runs, what its answers to a waiting run contain."""
    if not path.startswith("/v1/agents/"):
        return None
    if path.endswith("/ag-ui") and path.count("/") == 4:
        return b'"resume"'  # RunAgentInput.resume
    if path.endswith("/ai-sdk/chat") and path.count("/") == 5:
        return b'"approval-responded"'  # a tool part answered by the user
    return None


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body (b"" past ``limit``: no answer is that large); None on a disconnect."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b""
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the body already read over once, then goes on as before."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _full(scope: Scope) -> bool:
    services = scope["app"].state.services
    return services is not None and bool(services.admission.full)


def _refusal(scope: Scope) -> ProblemError | None:
    state = scope["app"].state
    services = state.services
    if services is None:  # not ready: the route answers 503
        return None
    authenticator = state.authenticator
    if authenticator.enabled:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            authenticator.principal(None if header is None else header.decode("latin-1"))
        except Unauthorized:
            return None  # the route answers 401
    shed: ServiceError | None = services.manager.shed()
    return None if shed is None else ProblemError.of(shed)
