"""A fake model upstream: real HTTP on loopback, speaking the OpenAI and Anthropic wire formats.

The real SDKs talk to it through their real HTTP stack, so tests exercise exactly what runs in
production: request encoding, SSE decoding, status handling, timeouts and dropped connections.

- ``POST /v1/chat/completions``: OpenAI Chat Completions (``data: {...}`` chunks, ``[DONE]``);
- ``POST /v1/messages``: Anthropic Messages (``event: message_start`` ... ``message_stop``);
- embeddings, ``/rerank``, images, speech, transcriptions and video jobs: see
  ``capability_wire`` (deterministic answers, unless a behaviour is scripted).

Each request takes the next *behaviour* from a queue (per model name first, then the shared
one); the behaviour is rendered in the wire format of the path it arrived on::

    async with FakeUpstream() as upstream:
        upstream.script(Text("Hello there"), status(429, retry_after=2), Drop())
        binding = ModelBinding.llm(model="m", base_url=upstream.openai_url, api_key="k")

Every request is recorded (method, path, headers with the credential, JSON body). Tests wait
for observable state with ``await upstream.wait_until(lambda: ...)``, never with sleeps.

The server runs on the current event loop (``async with FakeUpstream()``) or, for tests that
drive another process or block their own loop, on a loop in a daemon thread
(``with FakeUpstream.in_thread() as upstream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeAlias

from . import capability_wire
from .capability_wire import FakeVideo, Hold

__all__ = [
    "Behaviour",
    "Drop",
    "Endless",
    "FakeToolCall",
    "FakeUpstream",
    "FakeVideo",
    "Gate",
    "Hold",
    "Malformed",
    "RecordedRequest",
    "Respond",
    "Stall",
    "Status",
    "StreamError",
    "Text",
    "ToolCalls",
    "freeze_imports",
    "status",
]

Protocol: TypeAlias = Literal["openai", "anthropic"]

_WORDS = re.compile(r"\S+\s*|\s+")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def freeze_imports() -> None:
    """Move every object alive now (the imported modules above all) out of the collector's view.

    The two SDKs bring some 180,000 long-lived objects. While the collector tracks them, every
    full collection pauses the event loop for about a quarter of a second, which the runtime
    tests' blocking-call watchdog reports as a blocked loop. Call it once, after the imports.
    (A server process benefits from the same call after its warm-up.)
    """
    gc.freeze()


# gates --------------------------------------------------------------------------------------------


class Gate:
    """Holds streams at a point until ``open()``; usable from any thread or loop.

    ``waiting`` counts the responses currently held, so a test can wait until N calls are in
    flight before acting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.waiting = 0
        self.passed = 0

    @property
    def is_open(self) -> bool:
        """True once ``open()`` was called."""
        return self._open

    def open(self) -> None:
        """Release every held stream, and let later ones through."""
        with self._lock:
            self._open = True
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def enter(self) -> asyncio.Future[None]:
        """Count one more waiter now and return the future that resolves when the gate opens.

        Synchronous, so a caller can publish the new ``waiting`` count before it awaits.
        Pair it with ``leave``.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self.waiting += 1
            if self._open:
                future.set_result(None)
            else:
                self._waiters.append((loop, future))
        return future

    def leave(self, future: asyncio.Future[None]) -> None:
        """Stop waiting (the gate opened, or the waiter gave up)."""
        with self._lock:
            self.waiting -= 1
            self.passed += 1
            for index, (_loop, waiting) in enumerate(self._waiters):
                if waiting is future:
                    del self._waiters[index]
                    break

    async def wait(self) -> None:
        """Wait until the gate is open."""
        future = self.enter()
        try:
            await future
        finally:
            self.leave(future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# behaviours -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A streamed text answer. ``chunks`` defaults to one chunk per word.

    ``hold`` parks the stream after its first chunk until the gate opens; ``delay`` is the
    pause between chunks. ``usage`` is ``(input_tokens, output_tokens)``.
    """

    text: str
    chunks: Sequence[str] | None = None
    usage: tuple[int, int] | None = None
    hold: Gate | None = None
    delay: float = 0.0

    def pieces(self) -> list[str]:
        return list(self.chunks) if self.chunks is not None else _WORDS.findall(self.text)


@dataclass(frozen=True)
class FakeToolCall:
    """One tool call; its JSON arguments are streamed in ``fragments`` pieces."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None
    fragments: int = 3

    def argument_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))

    def argument_pieces(self) -> list[str]:
        raw = self.argument_text()
        count = max(1, min(self.fragments, len(raw) or 1))
        size = -(-len(raw) // count) if raw else 1
        return [raw[i : i + size] for i in range(0, len(raw), size)] or [""]


@dataclass(frozen=True)
class ToolCalls:
    """A streamed answer that calls tools, optionally after some text."""

    calls: Sequence[FakeToolCall]
    text: str = ""
    usage: tuple[int, int] | None = None
    hold: Gate | None = None


@dataclass(frozen=True)
class Status:
    """An error status with the protocol's JSON error body (and extra headers)."""

    status: int
    message: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    error_type: str | None = None


@dataclass(frozen=True)
class Drop:
    """Close the connection: before any response by default; with ``send_headers`` after the
    stream's headers and preamble; with ``after_chunks=N`` after N content chunks of ``text``.
    ``reset`` aborts with a TCP RST instead of a clean close. ``clean`` ends the HTTP body
    properly (its last chunk, connection kept) but without the protocol's end of the answer
    (OpenAI's ``finish_reason`` and ``[DONE]``, Anthropic's ``message_delta`` and
    ``message_stop``), as a proxy cutting an answer short may do."""

    after_chunks: int = 0
    text: str = "partial answer that never ends"
    send_headers: bool = False
    reset: bool = False
    clean: bool = False


@dataclass(frozen=True)
class Stall:
    """Read the request and never answer (until the client gives up or the server stops)."""


@dataclass(frozen=True)
class Endless:
    """Start a stream, send ``after_chunks`` chunks of ``text``, then never finish it.

    With ``ping_interval`` a keep-alive keeps the connection busy (so no read timeout fires):
    an SSE comment on the OpenAI wire, a ``ping`` event on the Anthropic one (as Anthropic sends).
    """

    text: str = "this stream never ends"
    after_chunks: int = 1
    ping_interval: float | None = None


@dataclass(frozen=True)
class StreamError:
    """A 200 stream that reports an error event after ``after_chunks`` chunks of ``text``."""

    error_type: str = "overloaded_error"
    message: str = "the upstream is overloaded"
    after_chunks: int = 0
    text: str = "partial answer"


@dataclass(frozen=True)
class Malformed:
    """A 200 whose body is not the protocol's JSON or SSE, as a broken proxy or aimock's
    ``malformed`` chaos sends: ``body`` with ``content_type``, the same for a streamed request
    and a whole one. ``sse=True`` sends it as one SSE ``data:`` event of a
    ``text/event-stream`` instead (an event whose data is not JSON)."""

    body: bytes = b"{malformed json: <<<chaos>>>"
    content_type: str = "application/json"
    sse: bool = False


@dataclass(frozen=True)
class Respond:
    """Choose the behaviour from the request itself (echo servers, routing by content)."""

    choose: Callable[[RecordedRequest], Behaviour]


Behaviour: TypeAlias = (
    Text | ToolCalls | Status | Drop | Stall | Endless | StreamError | Malformed | Respond | Hold
)


def status(
    code: int,
    message: str = "",
    *,
    retry_after: float | None = None,
    retry_after_ms: float | None = None,
    headers: Mapping[str, str] | None = None,
    error_type: str | None = None,
) -> Status:
    """A ``Status`` with optional ``retry-after`` / ``retry-after-ms`` headers."""
    extra = dict(headers or {})
    if retry_after is not None:
        extra["retry-after"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        extra["retry-after-ms"] = f"{retry_after_ms:g}"
    return Status(code, message or f"fake upstream answered {code}", extra, error_type)


# recorded requests ------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One request as the server received it. Header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    outcome: str = "pending"

    @property
    def json(self) -> Any:
        """The decoded JSON body (None if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def protocol(self) -> Protocol | None:
        """Which API the path belongs to."""
        if self.path.endswith("/chat/completions"):
            return "openai"
        if self.path.endswith("/messages"):
            return "anthropic"
        return None

    @property
    def model(self) -> str | None:
        """The ``model`` field of the body (JSON or multipart form)."""
        body = self.json
        if isinstance(body, dict):
            return body.get("model")
        found = self.form.get("model")
        return found if isinstance(found, str) else None

    @property
    def form(self) -> dict[str, bytes | str]:
        """The fields of a multipart body (files as bytes), else empty."""
        return capability_wire.multipart(self)

    @property
    def api_key(self) -> str | None:
        """The credential sent: ``x-api-key``, else the bearer token of ``authorization``."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    @property
    def messages(self) -> list[Any]:
        """The ``messages`` field of the body."""
        body = self.json
        return list(body.get("messages") or []) if isinstance(body, dict) else []

    @property
    def stream(self) -> bool:
        """True if the client asked for a stream."""
        body = self.json
        return bool(body.get("stream")) if isinstance(body, dict) else False


# wire formats -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Frame:
    data: bytes
    content: bool = False  # a chunk carrying answer content (text or argument fragment)


def _usage(usage: tuple[int, int] | None, produced: int) -> tuple[int, int]:
    return usage if usage is not None else (11, max(1, produced))


class _OpenAIWire:
    def __init__(self, request: RecordedRequest) -> None:
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.id = f"chatcmpl-{secrets.token_hex(6)}"

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(payload)}\n\n".encode()

    def preamble(self) -> list[_Frame]:
        return [_Frame(self._chunk({"role": "assistant", "content": ""}))]

    def text(self, piece: str) -> _Frame:
        return _Frame(self._chunk({"content": piece}), content=True)

    def tool_call(self, index: int, call: FakeToolCall, call_id: str) -> list[_Frame]:
        start = {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
        }
        frames = [_Frame(self._chunk(start))]
        for piece in call.argument_pieces():
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            frames.append(_Frame(self._chunk(delta), content=True))
        return frames

    def finish(self, reason: str, usage: tuple[int, int]) -> list[_Frame]:
        frames = [_Frame(self._chunk({}, reason))]
        if self.include_usage:
            payload = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": usage[0] + usage[1],
                },
            }
            frames.append(_Frame(f"data: {json.dumps(payload)}\n\n".encode()))
        frames.append(_Frame(b"data: [DONE]\n\n"))
        return frames

    def keepalive(self) -> _Frame:
        return _Frame(b": ping\n\n")

    def error_event(self, error_type: str, message: str) -> _Frame:
        payload = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        return _Frame(f"data: {json.dumps(payload)}\n\n".encode())

    def error_body(self, status_code: int, message: str, error_type: str | None) -> bytes:
        kind = error_type or _ERROR_TYPES.get(status_code, "server_error")
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return json.dumps(body).encode()

    def whole(
        self, text: str, calls: list[tuple[FakeToolCall, str]], usage: tuple[int, int]
    ) -> Any:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.argument_text()},
                }
                for call, call_id in calls
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": sum(usage),
            },
        }


class _AnthropicWire:
    def __init__(self, request: RecordedRequest) -> None:
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        self.id = f"msg_{secrets.token_hex(6)}"
        self.block = -1
        self.text_open = False
        self.input_tokens = 11

    @staticmethod
    def _event(name: str, payload: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()

    def set_usage(self, usage: tuple[int, int] | None) -> None:
        if usage is not None:
            self.input_tokens = usage[0]

    def preamble(self) -> list[_Frame]:
        start = {
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 1},
            },
        }
        return [
            _Frame(self._event("message_start", start)),
            _Frame(self._event("ping", {"type": "ping"})),
        ]

    def _open_text(self) -> list[_Frame]:
        if self.text_open:
            return []
        self.block += 1
        self.text_open = True
        block = {"type": "content_block_start", "index": self.block}
        block["content_block"] = {"type": "text", "text": ""}
        return [_Frame(self._event("content_block_start", block))]

    def _close_block(self) -> list[_Frame]:
        self.text_open = False
        stop = {"type": "content_block_stop", "index": self.block}
        return [_Frame(self._event("content_block_stop", stop))]

    def text(self, piece: str) -> list[_Frame]:
        frames = self._open_text()
        delta = {
            "type": "content_block_delta",
            "index": self.block,
            "delta": {"type": "text_delta", "text": piece},
        }
        frames.append(_Frame(self._event("content_block_delta", delta), content=True))
        return frames

    def tool_call(self, call: FakeToolCall, call_id: str) -> list[_Frame]:
        frames = self._close_block() if self.text_open else []
        self.block += 1
        start = {
            "type": "content_block_start",
            "index": self.block,
            "content_block": {"type": "tool_use", "id": call_id, "name": call.name, "input": {}},
        }
        frames.append(_Frame(self._event("content_block_start", start)))
        for piece in call.argument_pieces():
            delta = {
                "type": "content_block_delta",
                "index": self.block,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            frames.append(_Frame(self._event("content_block_delta", delta), content=True))
        frames.extend(self._close_block())
        return frames

    def finish(self, reason: str, usage: tuple[int, int]) -> list[_Frame]:
        frames = self._close_block() if self.text_open else []
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": usage[1]},
        }
        frames.append(_Frame(self._event("message_delta", delta)))
        frames.append(_Frame(self._event("message_stop", {"type": "message_stop"})))
        return frames

    def keepalive(self) -> _Frame:
        return _Frame(self._event("ping", {"type": "ping"}))

    def error_event(self, error_type: str, message: str) -> _Frame:
        payload = {"type": "error", "error": {"type": error_type, "message": message}}
        return _Frame(self._event("error", payload))

    def error_body(self, status_code: int, message: str, error_type: str | None) -> bytes:
        kind = error_type or _ERROR_TYPES.get(status_code, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def whole(
        self, text: str, calls: list[tuple[FakeToolCall, str]], usage: tuple[int, int]
    ) -> Any:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content.extend(
            {"type": "tool_use", "id": call_id, "name": call.name, "input": json.loads(raw)}
            for call, call_id in calls
            for raw in [call.argument_text() or "{}"]
        )
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }


# the server -------------------------------------------------------------------------------------


class _Disconnected(Exception):
    """The client went away while we were answering."""


class FakeUpstream:
    """The fake server. See the module docstring.

    ``default`` answers requests when the queues are empty (for load tests and echo servers);
    without one, an unscripted request gets 400 and is kept in ``unscripted``.
    """

    def __init__(self, *, default: Behaviour | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self.default = default
        self.requests: list[RecordedRequest] = []
        self.unscripted: list[RecordedRequest] = []
        self.disconnects = 0
        self.active = 0
        self.connections = 0
        self._queues: dict[str | None, deque[Behaviour]] = {None: deque()}
        self._lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopping: asyncio.Event | None = None
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # capability endpoints (see capability_wire)
        self.embedding_dimensions = capability_wire.FAKE_DIMENSIONS
        self.videos: dict[str, FakeVideo] = {}
        self.video_polls = 2
        self.video_gate: Gate | None = None

    # addresses ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        """The ``base_url`` of an OpenAI client (``.../v1``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """The ``base_url`` of an Anthropic client (the SDK adds ``/v1/messages``)."""
        return self.url

    # scripting ----------------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour, model: str | None = None) -> FakeUpstream:
        """Queue behaviours for the next requests (for one ``model`` only, if given)."""
        with self._lock:
            self._queues.setdefault(model, deque()).extend(behaviours)
        return self

    @property
    def remaining(self) -> int:
        """Scripted behaviours not used yet."""
        with self._lock:
            return sum(len(queue) for queue in self._queues.values())

    def assert_consumed(self) -> None:
        """Fail unless every scripted behaviour was used and no request went unscripted."""
        assert not self.remaining, f"{self.remaining} scripted behaviour(s) were never requested"
        assert not self.unscripted, f"{len(self.unscripted)} request(s) had no scripted behaviour"

    def _next(self, request: RecordedRequest) -> Behaviour | None:
        with self._lock:
            for key in (request.model, None):
                queue = self._queues.get(key)
                if queue:
                    return queue.popleft()
        return self.default

    # observation --------------------------------------------------------------------------------

    def _changed(self) -> None:
        with self._lock:
            watchers, self._watchers = self._watchers, []
        for loop, future in watchers:
            with contextlib.suppress(RuntimeError):  # that loop is gone
                loop.call_soon_threadsafe(_resolve, future)

    async def wait_until(self, predicate: Callable[[], bool], *, limit: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; re-checked whenever the server's state changes.

        ``limit`` (seconds) is a safety net against a hung test, not a synchronisation delay.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            future: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._watchers.append((loop, future))
            if predicate():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("the fake upstream never reached the expected state")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, remaining)

    async def wait_for_requests(self, count: int, *, limit: float = 10.0) -> None:
        """Wait until at least ``count`` requests arrived."""
        await self.wait_until(lambda: len(self.requests) >= count, limit=limit)

    # lifecycle on the current loop ----------------------------------------------------------------

    async def start(self) -> FakeUpstream:
        """Listen on an ephemeral port of the loopback interface."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def aclose(self) -> None:
        """Stop listening and end every open connection."""
        if self._server is None:
            return
        assert self._stopping is not None
        self._stopping.set()
        self._server.close()
        # closing a connection wakes its handler (a read sees EOF, a write fails), so every
        # handler ends normally; cancelling them would make asyncio log the cancellation
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:  # pragma: no cover - a handler that ignored its closed socket
                task.cancel()
        await self._server.wait_closed()
        self._server = None
        self._changed()

    async def __aenter__(self) -> FakeUpstream:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # lifecycle on a thread of its own -------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def in_thread(cls, **options: Any) -> Iterator[FakeUpstream]:
        """Run a server on its own loop in a daemon thread for the ``with`` block."""
        upstream = cls(**options)
        upstream.start_thread()
        try:
            yield upstream
        finally:
            upstream.stop_thread()

    def start_thread(self) -> None:
        """Start serving from a daemon thread; returns once the port is bound."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-upstream", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake upstream did not start")

    def stop_thread(self) -> None:
        """Stop a server started with ``start_thread``."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._thread = None

    def __enter__(self) -> FakeUpstream:
        self.start_thread()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_thread()

    # HTTP -----------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while self._stopping is not None and not self._stopping.is_set():
                request = await self._read_request(reader)
                if request is None:
                    break
                self.requests.append(request)
                self._changed()
                keep_open = await self._answer(request, reader, writer)
                self._changed()
                if not keep_open:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, _Disconnected):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            if not writer.is_closing():
                writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._changed()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
        line = await reader.readline()
        if not line.strip():
            return None
        method, target, _version = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            body = b"".join(parts)
        return RecordedRequest(method, target.split("?")[0], headers, body)

    async def _answer(
        self, request: RecordedRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must not be reused."""
        kind = capability_wire.capability_kind(request)
        if kind is not None:
            self.active += 1
            try:
                return await capability_wire.answer(self, kind, request, reader, writer)
            except (ConnectionError, _Disconnected):
                if self._stopping is None or not self._stopping.is_set():
                    self.disconnects += 1
                    request.outcome = "client disconnected"
                return False
            finally:
                self.active -= 1
        wire: _OpenAIWire | _AnthropicWire
        if request.method == "POST" and request.protocol == "openai":
            wire = _OpenAIWire(request)
        elif request.method == "POST" and request.protocol == "anthropic":
            wire = _AnthropicWire(request)
        else:
            request.outcome = "not found"
            await self._send_json(writer, 404, {"error": {"message": "no such endpoint"}})
            return True
        behaviour = self._next(request)
        while isinstance(behaviour, Respond):
            behaviour = behaviour.choose(request)
        if behaviour is None:
            self.unscripted.append(request)
            request.outcome = "unscripted"
            body = wire.error_body(400, "fake upstream: no behaviour was scripted", None)
            await self._send(writer, 400, {"content-type": "application/json"}, body)
            return True
        self.active += 1
        try:
            return await self._perform(behaviour, wire, request, reader, writer)
        except (ConnectionError, _Disconnected):
            if self._stopping is None or not self._stopping.is_set():
                self.disconnects += 1
                request.outcome = "client disconnected"
            return False
        finally:
            self.active -= 1

    async def _perform(
        self,
        behaviour: Behaviour,
        wire: _OpenAIWire | _AnthropicWire,
        request: RecordedRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if isinstance(behaviour, Status):
            request.outcome = f"status {behaviour.status}"
            body = wire.error_body(behaviour.status, behaviour.message, behaviour.error_type)
            headers = {"content-type": "application/json", **behaviour.headers}
            await self._send(writer, behaviour.status, headers, body)
            return True
        if isinstance(behaviour, Stall):
            request.outcome = "stalled"
            self._changed()
            await self._until_disconnect(reader)
            return False
        if isinstance(behaviour, Drop):
            return await self._drop(behaviour, wire, request, writer)
        if isinstance(behaviour, Malformed):
            request.outcome = "malformed"
            if behaviour.sse:
                await self._start_stream(writer)
                # Anthropic's SDK skips an event without a name: name it as its first
                named = b"event: message_start\n" if isinstance(wire, _AnthropicWire) else b""
                await self._write_chunk(writer, named + b"data: " + behaviour.body + b"\n\n")
                await self._end_stream(writer)
            else:
                headers = {"content-type": behaviour.content_type}
                await self._send(writer, 200, headers, behaviour.body)
            return True
        if not request.stream:
            return await self._whole(behaviour, wire, request, writer)
        await self._start_stream(writer)
        if isinstance(wire, _AnthropicWire) and isinstance(behaviour, (Text, ToolCalls)):
            wire.set_usage(behaviour.usage)
        await self._write_frames(writer, wire.preamble())
        if isinstance(behaviour, Text):
            pieces = behaviour.pieces()
            for index, piece in enumerate(pieces):
                if index and behaviour.delay:
                    await asyncio.sleep(behaviour.delay)
                await self._write_frames(writer, _as_list(wire.text(piece)))
                if index == 0 and behaviour.hold is not None:
                    request.outcome = "held"
                    self._changed()
                    await self._hold(behaviour.hold, reader)
            usage = _usage(behaviour.usage, len(pieces))
            await self._write_frames(writer, wire.finish(_stop(wire, tools=False), usage))
            await self._end_stream(writer)
            request.outcome = "ok"
            return True
        if isinstance(behaviour, ToolCalls):
            produced = 0
            for piece in _WORDS.findall(behaviour.text):
                await self._write_frames(writer, _as_list(wire.text(piece)))
                produced += 1
            for index, call in enumerate(behaviour.calls):
                call_id = call.id or _call_id(wire)
                if isinstance(wire, _OpenAIWire):
                    frames = wire.tool_call(index, call, call_id)
                else:
                    frames = wire.tool_call(call, call_id)
                await self._write_frames(writer, frames)
                produced += len(call.argument_pieces())
                if index == 0 and behaviour.hold is not None:
                    request.outcome = "held"
                    self._changed()
                    await self._hold(behaviour.hold, reader)
            usage = _usage(behaviour.usage, produced)
            await self._write_frames(writer, wire.finish(_stop(wire, tools=True), usage))
            await self._end_stream(writer)
            request.outcome = "ok"
            return True
        if isinstance(behaviour, StreamError):
            for piece in _WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
                await self._write_frames(writer, _as_list(wire.text(piece)))
            await self._write_frames(
                writer, [wire.error_event(behaviour.error_type, behaviour.message)]
            )
            await self._end_stream(writer)
            request.outcome = f"stream error {behaviour.error_type}"
            return True
        if isinstance(behaviour, Endless):
            for piece in _WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
                await self._write_frames(writer, _as_list(wire.text(piece)))
            request.outcome = "endless"
            self._changed()
            if behaviour.ping_interval is None:
                await self._until_disconnect(reader)
            else:
                while True:
                    await asyncio.sleep(behaviour.ping_interval)
                    await self._write_frames(writer, [wire.keepalive()])
            return False
        raise TypeError(f"not a behaviour: {behaviour!r}")  # pragma: no cover

    async def _drop(
        self,
        behaviour: Drop,
        wire: _OpenAIWire | _AnthropicWire,
        request: RecordedRequest,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if behaviour.send_headers or behaviour.after_chunks or behaviour.clean:
            await self._start_stream(writer)
            await self._write_frames(writer, wire.preamble())
            for piece in _WORDS.findall(behaviour.text)[: behaviour.after_chunks]:
                await self._write_frames(writer, _as_list(wire.text(piece)))
        request.outcome = f"dropped after {behaviour.after_chunks} chunk(s)"
        if behaviour.clean:
            await self._end_stream(writer)
            return True  # the connection stays usable
        if behaviour.reset:
            writer.transport.abort()
        else:
            writer.close()
        return False

    async def _whole(
        self,
        behaviour: Behaviour,
        wire: _OpenAIWire | _AnthropicWire,
        request: RecordedRequest,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if isinstance(behaviour, Text):
            payload = wire.whole(behaviour.text, [], _usage(behaviour.usage, 1))
        elif isinstance(behaviour, ToolCalls):
            calls = [(call, call.id or _call_id(wire)) for call in behaviour.calls]
            payload = wire.whole(behaviour.text, calls, _usage(behaviour.usage, 1))
        else:
            request.outcome = "unsupported"
            body = wire.error_body(
                400, f"fake upstream: {type(behaviour).__name__} needs a stream", None
            )
            await self._send(writer, 400, {"content-type": "application/json"}, body)
            return True
        request.outcome = "ok"
        await self._send_json(writer, 200, payload)
        return True

    # low-level writing ----------------------------------------------------------------------------

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter, code: int, headers: Mapping[str, str], body: bytes
    ) -> None:
        lines = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        lines.append(f"content-length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()

    async def _send_json(self, writer: asyncio.StreamWriter, code: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        await self._send(writer, code, {"content-type": "application/json"}, body)

    @staticmethod
    async def _start_stream(writer: asyncio.StreamWriter) -> None:
        head = (
            "HTTP/1.1 200 OK\r\n"
            "content-type: text/event-stream; charset=utf-8\r\n"
            "cache-control: no-cache\r\n"
            "transfer-encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode("latin-1"))
        await writer.drain()

    @staticmethod
    async def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        if writer.is_closing():
            raise _Disconnected
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    async def _write_frames(self, writer: asyncio.StreamWriter, frames: list[_Frame]) -> None:
        for frame in frames:
            await self._write_chunk(writer, frame.data)

    @staticmethod
    async def _end_stream(writer: asyncio.StreamWriter) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _until_disconnect(self, reader: asyncio.StreamReader) -> None:
        """Return when the client closes its end; raise _Disconnected then."""
        while await reader.read(4096):
            pass
        raise _Disconnected

    async def _hold(self, gate: Gate, reader: asyncio.StreamReader) -> None:
        """Wait for the gate; a client that leaves meanwhile ends the response."""
        opened = gate.enter()
        self._changed()  # gate.waiting grew: wake wait_until() callers
        watcher = asyncio.ensure_future(self._until_disconnect(reader))
        try:
            await asyncio.wait({opened, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gate.leave(opened)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            self._changed()
        if not opened.done():
            opened.cancel()
            raise _Disconnected


def _as_list(frames: _Frame | list[_Frame]) -> list[_Frame]:
    return frames if isinstance(frames, list) else [frames]


def _stop(wire: _OpenAIWire | _AnthropicWire, *, tools: bool) -> str:
    if isinstance(wire, _OpenAIWire):
        return "tool_calls" if tools else "stop"
    return "tool_use" if tools else "end_turn"


def _call_id(wire: _OpenAIWire | _AnthropicWire) -> str:
    prefix = "call_" if isinstance(wire, _OpenAIWire) else "toolu_"
    return prefix + secrets.token_hex(8)
