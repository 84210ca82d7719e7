"""The connection guard's body writer (``scope["extensions"]["agent.body_writer"]``): more
chunks of a streamed response written at once, below the app's send wrappers, on a real
uvicorn server over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import uvicorn

from app.server.http_protocol import GuardedHttpToolsProtocol

Writer = Callable[[bytes], bool]


class _App:
    """Streams a head, then what the test hands it through its writer; records what the
    writer factory answered at each step."""

    def __init__(self) -> None:
        self.before_head: Writer | str | None = "unset"
        self.writer: Writer | None = None
        self.ready = asyncio.Event()
        self.finish = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        factory = scope["extensions"]["agent.body_writer"]
        if scope["method"] == "HEAD":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            self.writer = factory()
            await send({"type": "http.response.body", "body": b""})
            self.ready.set()
            return
        self.before_head = factory()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self.writer = factory()
        self.ready.set()
        await self.finish.wait()
        await send({"type": "http.response.body", "body": b"data: end\n\n", "more_body": False})


@contextlib.asynccontextmanager
async def _serve(app: _App) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=GuardedHttpToolsProtocol, lifespan="off", log_level="error")
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    # listening once startup returns: no serve loop to wait for
    await server.startup(sockets=[sock])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.shutdown(sockets=[sock])
        sock.close()


async def _get(base: str, app: _App) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw GET on a connection of its own, once the app has sent the response's head."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await app.ready.wait()
    return reader, writer


async def test_chunks_written_at_once_reach_the_client_in_order() -> None:
    app = _App()
    async with (
        _serve(app) as base,
        httpx.AsyncClient(base_url=base) as client,
        client.stream("GET", "/") as response,
    ):
        await app.ready.wait()
        # nothing to write on before the head is out; a writer once it is
        assert app.before_head is None
        write = app.writer
        assert write is not None
        assert write(b"data: 1\n\n") and write(b"") and write(b"data: 2\n\n")
        app.finish.set()
        body = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.headers["transfer-encoding"] == "chunked"
    assert body == b"data: 1\n\ndata: 2\n\ndata: end\n\n"
    # the response is over: the writer bound to it writes nothing more
    assert write(b"data: late\n\n") is False


async def test_no_writer_for_a_head_request() -> None:
    app = _App()
    async with _serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.head("/")
        assert response.status_code == 200
        assert app.writer is None


async def test_the_writer_refuses_once_the_client_is_gone() -> None:
    app = _App()
    async with _serve(app) as base:
        reader, writer = await _get(base, app)
        write = app.writer
        assert write is not None and write(b"data: 1\n\n")
        assert (await reader.readuntil(b"data: 1\n\n")).endswith(b"data: 1\n\n")
        writer.close()
        await writer.wait_closed()
        # the server learns of the close a loop step or two later
        for _ in range(200):
            if not write(b"data: 2\n\n"):
                break
            await asyncio.sleep(0.01)
        assert write(b"data: 3\n\n") is False
        app.finish.set()


async def test_a_paused_transport_refuses_the_write() -> None:
    """Over the transport's high-water mark the writer writes nothing: the stream falls back
    to an awaited send, which waits for the client under the send timeout."""
    app = _App()
    async with _serve(app) as base:
        _, writer = await _get(base, app)
        write = app.writer
        assert write is not None
        # a client that does not read: the server's buffer fills past its high-water mark
        chunk = b"x" * 65536
        for _ in range(2000):
            if not write(chunk):
                break
        else:
            pytest.fail("the writer never saw the transport paused")
        assert write(b"more") is False
        writer.close()
        app.finish.set()
