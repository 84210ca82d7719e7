"""A webhook receiver on loopback: a real HTTP/1.1 server that verifies what it is sent.

Each request's signature is checked with the Standard Webhooks reference library
(``standardwebhooks``); deliveries are deduplicated by ``webhook-id`` as a receiver should.
``answers`` scripts the status of each request in turn (then 200), ``delays`` how long each
answer is held back; ``redirect_to`` answers every request with a 307 to that URL instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = ["Received", "WebhookReceiver"]


@dataclass
class Received:
    """One request as it arrived."""

    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    secret: str
    answers: list[int] = field(default_factory=list)
    redirect_to: str | None = None
    delays: list[float] = field(default_factory=list)
    """Seconds each request's answer is held back, in turn (it is acted on at once)."""
    requests: list[Received] = field(default_factory=list)
    deliveries: dict[str, Any] = field(default_factory=dict)
    """Verified, answered 2xx, by webhook-id: what a deduplicating receiver acted on."""
    duplicates: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, port: int = 0, tls: ssl.SSLContext | None = None) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def wait_for(self, check: Any, within: float = 20.0) -> None:
        """Wait until ``check(self)`` holds (re-checked on every request)."""
        async with asyncio.timeout(within):
            while not check(self):
                self._changed.clear()
                await self._changed.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, path, _version = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            try:
                Webhook(self.secret).verify(body, headers, json_parse=False)
                verified = True
            except WebhookVerificationError:
                verified = False
            extra = ""
            if self.redirect_to is not None:
                status = 307
                extra = f"Location: {self.redirect_to}\r\n"
            else:
                status = self.answers.pop(0) if self.answers else 200
            received = Received(path, headers, body, verified, status)
            self.requests.append(received)
            if verified and 200 <= status < 300:
                if received.webhook_id in self.deliveries:
                    self.duplicates += 1
                else:
                    self.deliveries[received.webhook_id] = received.json()
            self._changed.set()
            if self.delays:
                await asyncio.sleep(self.delays.pop(0))  # a receiver slow to answer
            head_out = f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n{extra}Connection: close"
            writer.write(f"{head_out}\r\n\r\n".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._changed.set()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
