"""The HTTP/1.1 connection guard under the app: what uvicorn does not bound on its own.

``GuardedHttpToolsProtocol`` is uvicorn's httptools protocol with three limits added, each
answered below the app (the app never sees such a connection) and counted:

- **the request head's size** (``AGENT_MAX_HEADER_BYTES``, 64 KiB): a request line plus
  headers beyond it is answered ``431`` and the connection closed. httptools buffers a head of
  any size; a head still incomplete is refused as soon as more than the cap has arrived.
- **the time to send a request head** (``AGENT_HEADER_TIMEOUT``, 10 s): a connection whose head
  is not complete that long after it opened (or after its previous response, once the
  keep-alive timeout let it send another) is closed, with ``408`` when part of a head arrived.
  Slow or silent clients cannot hold sockets and file descriptors for ever.
- **open connections per worker** (``AGENT_MAX_CONNECTIONS``, clamped below the process's file
  limit): a connection beyond it is answered ``503`` with ``Retry-After`` at once and closed,
  so the worker keeps the descriptors its store, bus and model calls need.

A request httptools cannot parse (a control character such as DEL in a header value, which
RFC 9110 forbids) is answered ``400`` problem+json here rather than with uvicorn's plain text:
``invalid_header`` with the header's name in ``header`` when the offending line names one
(``Idempotency-Key: a\x7fb``), else ``bad_request``.

It also gives each request's scope an ``abort`` callable (``scope["extensions"]
["agent.abort"]``): a response whose client stopped reading drops the connection and what its
transport still buffers, which closing cannot do (a close waits for the buffer to flush). And a
``write_paused`` one (``["agent.write_paused"]``): True while the transport's buffer is over its
high-water mark, the only time a body write waits; an event stream bounds those writes by its
send timeout and writes the others without arming a timer. And ``["agent.body_writer"]``: once a
chunked response's head is sent, a synchronous writer of its further chunks, which an event
stream uses for each event instead of awaiting ``send`` through every middleware's wrapper (none
of them looks at a body; the head and the last chunk still go through them).

A subclass rather than another server: it keeps uvicorn's parser, flow control, lifespan,
workers and signals, and adds one timer handle and two counters per connection (measured in
docs/reliability.md). The limits are per process, set by ``configure`` (``create_app`` calls
it), so every worker of ``agent-server --workers N`` applies its own settings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "STATS",
    "EdgeLimits",
    "EdgeStats",
    "GuardedHttpToolsProtocol",
    "configure",
    "effective_max_connections",
    "limits",
]

logger = logging.getLogger("app.http")

# descriptors a worker keeps for itself beyond client connections: its store and bus pools,
# model connections, MCP servers, log files and the interpreter's own
_FD_RESERVE = 64
_LOG_INTERVAL = 5.0


@dataclass(frozen=True)
class EdgeLimits:
    """The limits one worker applies to its client connections."""

    max_header_bytes: int = 65_536
    header_timeout: float = 10.0
    max_connections: int = 4096


@dataclass
class EdgeStats:
    """Counts of this process's connections (read by ``/metrics``)."""

    open: int = 0
    refused: int = 0
    header_timeouts: int = 0
    headers_too_large: int = 0


STATS = EdgeStats()
_limits = EdgeLimits()


def limits() -> EdgeLimits:
    """The limits in force in this process."""
    return _limits


def effective_max_connections(wanted: int, reserve: int) -> int:
    """``wanted`` connections, or fewer if the file limit cannot hold them beside ``reserve``.

    Raises the soft ``RLIMIT_NOFILE`` towards the hard one first when it is too low.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + reserve + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):  # pragma: no cover - a platform refusing
                pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - reserve - _FD_RESERVE))


def configure(new: EdgeLimits) -> None:
    """Set this process's limits (for the connections accepted from now on)."""
    global _limits
    _limits = new


class _Throttled:
    """A warning logged at most once per interval, with the count of what it stands for."""

    def __init__(self, message: str) -> None:
        self._message = message
        self._last = -_LOG_INTERVAL
        self._pending = 0
        self._flush: asyncio.TimerHandle | None = None

    def note(self, loop: asyncio.AbstractEventLoop, **extra: Any) -> None:
        self._pending += 1
        now = time.monotonic()
        if now - self._last >= _LOG_INTERVAL:
            self._emit(extra)
        elif self._flush is None:
            self._flush = loop.call_later(
                _LOG_INTERVAL - (now - self._last), self._emit_later, extra
            )

    def _emit_later(self, extra: dict[str, Any]) -> None:
        self._flush = None
        if self._pending:
            self._emit(extra)

    def _emit(self, extra: dict[str, Any]) -> None:
        self._last = time.monotonic()
        count, self._pending = self._pending, 0
        logger.warning(self._message, count, extra={**extra, "connections": count})


_timeout_log = _Throttled(
    "closed %d connection(s) whose request head was incomplete after AGENT_HEADER_TIMEOUT"
)
_large_log = _Throttled("refused %d request head(s) larger than AGENT_MAX_HEADER_BYTES (431)")
_refused_log = _Throttled("refused %d connection(s) beyond AGENT_MAX_CONNECTIONS (503)")


def _problem(
    status: int,
    reason: str,
    code: str,
    detail: str,
    extra: bytes = b"",
    *,
    extra_member: bytes = b"",
) -> bytes:
    body = (
        f'{{"type":"about:blank","title":"{reason}","status":{status},'
        f'"detail":{json.dumps(detail)},"code":"{code}"'
    ).encode()
    body += (b"," + extra_member if extra_member else b"") + b"}"
    return (
        f"HTTP/1.1 {status} {reason}\r\n".encode()
        + b"content-type: application/problem+json\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n"
        + extra
        + b"\r\n"
        + body
    )


_TOO_LARGE = _problem(
    431,
    "Request Header Fields Too Large",
    "header_too_large",
    "the request line and headers exceed the server's limit",
)
_TIMEOUT = _problem(
    408, "Request Timeout", "header_timeout", "the request head did not arrive in time"
)
_REFUSED = _problem(
    503,
    "Service Unavailable",
    "overloaded",
    "the server has too many open connections",
    b"retry-after: 1\r\n",
)


async def _header_too_large(scope: Any, receive: Any, send: Any) -> None:
    """The app answering a complete head over the cap (uvicorn then closes: ``connection:
    close``); the request's body is never read."""
    status, headers, body = _TOO_LARGE_PARTS
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _parts(raw: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = [
        (name.strip(), value.strip())
        for name, _, value in (line.partition(b":") for line in lines[1:])
        if name.strip() != b"content-length"
    ]
    return status, headers, body


_TOO_LARGE_PARTS = _parts(_TOO_LARGE)

# a header line whose value holds a byte RFC 9110 does not allow there (a control character
# other than tab, or DEL); its name if it is a token
_BAD_LINE = re.compile(rb"^(?:([!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}):)?[^\n]*?[\x00-\x08\x0a-\x1f\x7f]")


def _bad_request(data: bytes) -> bytes:
    """The 400 problem for a head the parser refused, naming the header at fault if it can
    (found in ``data``, the bytes that made the parser fail)."""
    for line in data.split(b"\n"):
        found = _BAD_LINE.match(line.removesuffix(b"\r"))
        if found is None:
            continue
        name = (found.group(1) or b"").decode("ascii")
        said = f"the header {name!r}" if name else "a header"
        detail = (
            f"the value of {said} holds a control character; header values are visible "
            "ASCII, spaces and tabs"
        )
        member = b'"header":' + json.dumps(name.lower()).encode() if name else b""
        return _problem(400, "Bad Request", "invalid_header", detail, extra_member=member)
    return _problem(400, "Bad Request", "bad_request", "the request could not be parsed")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size cap, a head timeout and a connection cap."""

    # True while the parser is inside a request head or between requests
    _head_pending = True
    _head_bytes = 0
    _head_timer: asyncio.TimerHandle | None = None
    _refused = False
    _counted = False
    _last_data = b""
    _extensions: dict[str, Any]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        lim = _limits
        if STATS.open >= lim.max_connections:
            # before uvicorn knows of it: nothing of its state to undo at connection_lost
            self._refused = True
            STATS.refused += 1
            _refused_log.note(self.loop, limit=lim.max_connections)
            transport.write(_REFUSED)
            transport.close()
            return
        STATS.open += 1
        self._counted = True
        super().connection_made(transport)
        self._extensions = {
            "agent.abort": self._abort,
            "agent.write_paused": self._write_paused,
            "agent.body_writer": self._body_writer,
        }
        self._arm_head_timer()

    def _abort(self) -> None:
        """Drop the connection now, with what its transport still buffers. The response in
        flight counts as disconnected at once (asyncio reports the loss a step later): it
        was cut on purpose, not left incomplete by mistake, which uvicorn would log."""
        self.transport.abort()
        if self.cycle is not None:
            self.cycle.disconnected = True

    def _write_paused(self) -> bool:
        """Whether the next body write waits for the client to read (uvicorn's flow control)."""
        return bool(self.flow.write_paused)

    def _body_writer(self) -> Callable[[bytes], bool] | None:
        """A writer of more chunks of the response under way (its head sent, chunked), bound
        to this request's cycle; None for any other."""
        cycle = self.cycle
        if (
            cycle is None
            or not cycle.response_started
            or cycle.response_complete
            or not cycle.chunked_encoding
            or cycle.scope["method"] == "HEAD"
        ):
            return None
        transport = self.transport
        flow = self.flow

        def write(body: bytes) -> bool:
            # what uvicorn's send does for a chunk that is not the last, minus the awaits:
            # False (nothing written) once the client is gone, the response ended, or the
            # transport is over its high-water mark, where a write must wait its turn
            if cycle.disconnected or cycle.response_complete or flow.write_paused:
                return False
            if body:
                transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            return True

        return write

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        if self._counted:
            self._counted = False
            STATS.open -= 1
        self._disarm_head_timer()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # the connection goes to the WebSocket protocol, which reports its end to itself
        self._head_pending = False
        self._disarm_head_timer()
        if self._counted:
            self._counted = False
            STATS.open -= 1
        super().handle_websocket_upgrade()

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return
        counting = self._head_pending
        if counting:
            self._head_bytes += len(data)
            # a new request after the keep-alive wait: its head has a deadline too
            if self._head_timer is None:
                self._arm_head_timer()
        self._last_data = data  # what a parse error is about (send_400_response)
        super().data_received(data)
        self._last_data = b""
        if (
            counting
            and self._head_pending
            and self._head_bytes > _limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            # still no end of the head: refuse without waiting for (or buffering) the rest
            STATS.headers_too_large += 1
            _large_log.note(self.loop, limit=_limits.max_header_bytes)
            self._disarm_head_timer()
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A request the parser refused: problem+json (uvicorn's own is plain text)."""
        self._disarm_head_timer()
        self.transport.write(_bad_request(self._last_data))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = self._extensions

    def on_headers_complete(self) -> None:
        self._head_pending = False
        received, self._head_bytes = self._head_bytes, 0
        self._disarm_head_timer()
        cap = _limits.max_header_bytes
        # the bytes that carried the head bound its size: measured only when they exceed the cap
        if 0 < received <= cap or (
            len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) <= cap
        ):
            super().on_headers_complete()
            return
        STATS.headers_too_large += 1
        _large_log.note(self.loop, limit=_limits.max_header_bytes)
        app = self.app
        self.app = _header_too_large
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # what follows on this connection is the next request's head
        self._head_pending = True
        self._head_bytes = 0

    # --- the head timer ----------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(_limits.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._head_pending or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined head waits while the response before it is written
            self._arm_head_timer()
            return
        STATS.header_timeouts += 1
        _timeout_log.note(self.loop, timeout=_limits.header_timeout)
        if self._head_bytes:
            self.transport.write(_TIMEOUT)
        self.transport.close()
