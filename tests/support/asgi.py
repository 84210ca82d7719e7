"""Drive the app in-process through raw ASGI ``receive``/``send``.

httpx's ``ASGITransport`` buffers a whole response body, so it cannot show a stream as it
happens, a client that disconnects mid-stream, or one that stops reading. ``ASGIRequest``
can: it runs one request as a task, records every message the app sends, and lets the test
disconnect or stall the client at any point.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE frame: an event (``id``/``event``/``data``) or a comment."""

    id: int | None
    event: str | None
    data: dict[str, Any] | None
    comment: str | None = None


def parse_frames(text: str) -> list[Frame]:
    """The complete frames of an SSE body (a trailing partial frame is left out): each
    comment line is a frame of its own, an event ends at a blank line."""
    frames: list[Frame] = []
    event_id: int | None = None
    event: str | None = None
    data: dict[str, Any] | None = None
    for line in text.split("\n")[:-1]:
        if line.startswith(":"):
            frames.append(Frame(None, None, None, line[1:].strip()))
        elif line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
        elif not line and (event_id, event, data) != (None, None, None):
            frames.append(Frame(event_id, event, data))
            event_id, event, data = None, None, None
    return frames


class ASGIRequest:
    """One HTTP request against an ASGI app, as a task."""

    def __init__(
        self,
        app: ASGIApp,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
        query: str = "",
    ) -> None:
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        self._body = body
        self._body_sent = False
        self._disconnected = asyncio.Event()
        self._send_gate: asyncio.Event | None = None
        self.messages: list[Message] = []
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # the client side ------------------------------------------------------------------------

    def start(self) -> ASGIRequest:
        """Begin the request."""
        self.task = asyncio.ensure_future(self.app(self.scope, self._receive, self._send))
        self.task.add_done_callback(lambda _: self._changed.set())
        return self

    def disconnect(self) -> None:
        """The client goes away."""
        self._disconnected.set()

    def stall(self) -> None:
        """The client stops reading: every later ``send`` blocks."""
        self._send_gate = asyncio.Event()

    async def _receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        gate = self._send_gate
        if gate is not None and message["type"] == "http.response.body":
            await gate.wait()
        self.messages.append(message)
        self._changed.set()

    # what the app answered ------------------------------------------------------------------

    @property
    def status(self) -> int | None:
        """The response status, once started."""
        for message in self.messages:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    @property
    def headers(self) -> dict[str, str]:
        """The response headers (lower-case names)."""
        for message in self.messages:
            if message["type"] == "http.response.start":
                return {k.decode().lower(): v.decode() for k, v in message["headers"]}
        return {}

    @property
    def body(self) -> bytes:
        """Everything sent so far."""
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )

    @property
    def complete(self) -> bool:
        """True once the app sent the last body message."""
        return any(
            m["type"] == "http.response.body" and not m.get("more_body", False)
            for m in self.messages
        )

    def frames(self) -> list[Frame]:
        """The SSE frames received so far."""
        return parse_frames(self.body.decode())

    def events(self) -> list[Frame]:
        """The SSE events (not comments) received so far."""
        return [f for f in self.frames() if f.event is not None]

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)

    async def wait_for(self, predicate: Callable[[ASGIRequest], bool], within: float = 10) -> None:
        """Wait until ``predicate(self)`` holds (re-checked at each message)."""
        async with asyncio.timeout(within):
            while not predicate(self):
                self._changed.clear()
                if self.task is not None and self.task.done():
                    self.task.result()
                    if not predicate(self):
                        raise AssertionError("the request ended before the condition held")
                    return
                await self._changed.wait()

    async def finish(self, within: float = 10.0) -> None:
        """Wait for the app to return."""
        assert self.task is not None
        async with asyncio.timeout(within):
            await self.task
