"""HTTP/1.1 on an asyncio stream: reading a request, writing a response or a chunked stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from .frames import Frame
from .recording import RecordedRequest

__all__ = [
    "Disconnected",
    "end_stream",
    "read_request",
    "send",
    "send_json",
    "start_stream",
    "until_disconnect",
    "write_chunk",
    "write_frames",
]

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


class Disconnected(Exception):
    """The client went away while we were answering."""


async def read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    """The next request on the connection, or None once the client sends no more."""
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


async def send(
    writer: asyncio.StreamWriter, code: int, headers: Mapping[str, str], body: bytes
) -> None:
    """A whole response with ``content-length``."""
    lines = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    lines.append(f"content-length: {len(body)}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


async def send_json(writer: asyncio.StreamWriter, code: int, payload: Any) -> None:
    """A whole JSON response."""
    body = json.dumps(payload).encode()
    await send(writer, code, {"content-type": "application/json"}, body)


async def start_stream(writer: asyncio.StreamWriter) -> None:
    """The head of a chunked ``text/event-stream`` response."""
    head = (
        "HTTP/1.1 200 OK\r\n"
        "content-type: text/event-stream; charset=utf-8\r\n"
        "cache-control: no-cache\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    )
    writer.write(head.encode("latin-1"))
    await writer.drain()


async def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One HTTP chunk; raises Disconnected if the connection is closing."""
    if writer.is_closing():
        raise Disconnected
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def write_frames(writer: asyncio.StreamWriter, frames: list[Frame]) -> None:
    """Each frame as one HTTP chunk."""
    for frame in frames:
        await write_chunk(writer, frame.data)


async def end_stream(writer: asyncio.StreamWriter) -> None:
    """The last chunk of a chunked response (the connection stays usable)."""
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def until_disconnect(reader: asyncio.StreamReader) -> None:
    """Wait until the client closes its end, then raise Disconnected."""
    while await reader.read(4096):
        pass
    raise Disconnected
