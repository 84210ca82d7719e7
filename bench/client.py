"""A minimal HTTP/1.1 client on raw asyncio streams, for the load generator.

It does only what the benchmarks need, as cheaply as possible: one request at a time per
connection (keep-alive), bodies by ``content-length`` or ``chunked``, and a streaming body
read chunk by chunk so that SSE frames can be counted without being parsed. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Connection", "FrameCounter", "HTTPError", "Response", "SSEEvent", "SSEParser"]

_LIMIT = 1 << 22


class HTTPError(Exception):
    """A malformed answer or a connection that closed mid-answer."""


@dataclass(slots=True)
class Response:
    """Status, lower-case headers and (for ``read_body``) the body."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    chunked: bool = False
    length: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One keep-alive connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the benchmark client talks to loopback only")
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._host_header = f"{host}:{port}".encode()

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, limit=_LIMIT
        )

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    def abort(self) -> None:
        """Drop the connection at once (RST), as a client that vanished would."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.transport.abort()

    def send_request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Write the request (no await: the kernel buffers it)."""
        if self._writer is None:
            raise HTTPError("not connected")
        head = [f"{method} {path} HTTP/1.1".encode(), b"host: " + self._host_header]
        if body is not None:
            head.append(b"content-type: application/json")
            head.append(f"content-length: {len(body)}".encode())
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}".encode())
        self._writer.write(b"\r\n".join(head) + b"\r\n\r\n" + (body or b""))

    async def read_head(self) -> Response:
        """The status line and headers of the answer."""
        reader = self._reader
        if reader is None:
            raise HTTPError("not connected")
        line = await reader.readline()
        if not line:
            raise HTTPError("connection closed before the status line")
        parts = line.split(b" ", 2)
        if len(parts) < 2:
            raise HTTPError(f"bad status line {line!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n"):
                break
            if not raw:
                raise HTTPError("connection closed in the headers")
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = int(headers["content-length"]) if "content-length" in headers else None
        return Response(status, headers, chunked=chunked, length=length)

    async def read_chunk(self, response: Response) -> bytes:
        """The next piece of a streamed body; ``b""`` at its end."""
        reader = self._reader
        if reader is None:
            raise HTTPError("not connected")
        if response.chunked:
            line = await reader.readline()
            if not line:
                raise HTTPError("connection closed in a chunked body")
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                await reader.readline()  # the empty trailer
                return b""
            data = await reader.readexactly(size + 2)
            return data[:-2]
        if response.length is not None:
            if response.length == 0:
                return b""
            data = await reader.read(min(response.length, _LIMIT))
            if not data:
                raise HTTPError("connection closed in the body")
            response.length -= len(data)
            return data
        return await reader.read(_LIMIT)  # until close

    async def read_body(self, response: Response) -> bytes:
        """The whole body."""
        if not response.chunked and response.length is not None:
            reader = self._reader
            if reader is None:
                raise HTTPError("not connected")
            body = await reader.readexactly(response.length) if response.length else b""
            response.length = 0
            response.body = body
            return body
        parts: list[bytes] = []
        while True:
            data = await self.read_chunk(response)
            if not data:
                break
            parts.append(data)
        response.body = b"".join(parts)
        return response.body

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """A whole request and answer (JSON body if ``body`` is not bytes)."""
        raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        reused = self.connected
        if not reused:
            await self.connect()
        try:
            self.send_request(method, path, raw, headers)
            response = await self.read_head()
        except (HTTPError, ConnectionError) as exc:
            # the server closed an idle keep-alive connection before reading this request
            # (uvicorn does after 5 s): the request was not processed, so it is sent again
            if not reused or (isinstance(exc, HTTPError) and "status line" not in str(exc)):
                raise
            await self.close()
            await self.connect()
            self.send_request(method, path, raw, headers)
            response = await self.read_head()
        await self.read_body(response)
        if response.headers.get("connection", "").lower() == "close":
            await self.close()
        return response


class FrameCounter:
    """Counts SSE frames (blank-line separated) across chunk boundaries, without parsing.

    JSON data lines cannot hold a raw newline, so ``\\n\\n`` only ends frames. The last few
    chunks are kept, so that the terminal frame can be checked once the body ends.
    """

    __slots__ = ("_last_newline", "_recent", "frames")

    def __init__(self) -> None:
        self.frames = 0
        self._last_newline = False
        self._recent: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.frames += data.count(b"\n\n")
        if self._last_newline and data[:1] == b"\n":
            self.frames += 1
        self._last_newline = data[-1:] == b"\n"
        recent = self._recent
        recent.append(data)
        if len(recent) > 3:
            del recent[0]

    @property
    def tail(self) -> bytes:
        """The last chunks received (the end of the body)."""
        return b"".join(self._recent)


@dataclass(slots=True)
class SSEEvent:
    event: str
    data: str
    id: str | None


class SSEParser:
    """A small SSE parser for the scenarios that read event contents (few events)."""

    def __init__(self, on_event: Callable[[SSEEvent], None] | None = None) -> None:
        self._buffer = b""
        self.events: list[SSEEvent] = []
        self._on_event = on_event

    def feed(self, data: bytes) -> list[SSEEvent]:
        self._buffer += data.replace(b"\r\n", b"\n")
        out: list[SSEEvent] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            name, data_lines, ident = "message", [], None
            for line in block.decode().split("\n"):
                if not line or line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "event":
                    name = value
                elif key == "data":
                    data_lines.append(value)
                elif key == "id":
                    ident = value
            if not data_lines:
                continue
            event = SSEEvent(name, "\n".join(data_lines), ident)
            out.append(event)
            if self._on_event is not None:
                self._on_event(event)
        self.events.extend(out)
        return out
