"""A loopback TCP proxy in front of a real server (PostgreSQL, Redis), with outages on demand.

``FaultyProxy(target_port)`` runs on a thread of its own (the server under test is another
process) and forwards bytes both ways until told otherwise:

- ``refuse()``: what a stopped server looks like: the port is closed (new connections are
  refused) and every open connection is reset;
- ``blackhole()``: what a dead network path looks like: connections are accepted, open ones
  stay open, but no byte goes through in either direction (so only timeouts notice);
- ``restore()``: forward again (connections held during a black hole resume).

``CuttingProxy(target_port, seed=...)`` is a proxy in front of the HTTP service that cuts
answers mid-body, the way a flaky network or a restarted load balancer does: each
connection's answer is cut after a random number of body bytes (after its head, so every
cut connection first delivered a response), alternately with a FIN (a clean close) and an
RST (a reset), until ``cuts`` connections were cut; later ones flow whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any, Self

__all__ = ["CuttingProxy", "FaultyProxy"]


class FaultyProxy:
    """See the module docstring. Use as a context manager (it stops the thread)."""

    def __init__(
        self, target_port: int, target_host: str = "127.0.0.1", *, listen_host: str = "127.0.0.1"
    ) -> None:
        """``listen_host``: where the proxy listens (``0.0.0.0`` to be reached from network
        namespaces over their veth addresses)."""
        self._target = (target_host, target_port)
        self._listen_host = listen_host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        with socket.socket() as probe:
            probe.bind((listen_host, 0))
            self.port: int = probe.getsockname()[1]
        self.mode = "forward"

    def __enter__(self) -> Self:
        self._thread.start()
        self._call(self._listen())
        self._loop.call_soon_threadsafe(self._flowing.set)
        return self

    def __exit__(self, *_: Any) -> None:
        self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    # --- faults --------------------------------------------------------------------------------

    def refuse(self) -> None:
        self.mode = "refuse"
        self._call(self._close_all())

    def blackhole(self) -> None:
        self.mode = "blackhole"
        self._loop.call_soon_threadsafe(self._flowing.clear)
        self._call(self._listen())

    def restore(self) -> None:
        self.mode = "forward"
        self._call(self._listen())
        self._loop.call_soon_threadsafe(self._flowing.set)

    # --- plumbing ------------------------------------------------------------------------------

    def _call(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._handle, self._listen_host, self.port, reuse_address=True
            )

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            transport = writer.transport
            with contextlib.suppress(Exception):
                # a reset, as a crashed server's kernel sends
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
            transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._flowing.wait()  # a black hole holds new connections too
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                end.transport.abort()
                self._writers.discard(end)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        sink.transport.abort()


class _Cut(Exception):
    """This connection was cut."""


class CuttingProxy(FaultyProxy):
    """See the module docstring. ``cut_count`` and ``resets`` say what it did."""

    def __init__(
        self,
        target_port: int,
        *,
        seed: int = 0,
        cuts: int = 10,
        min_bytes: int = 200,
        max_bytes: int = 3000,
    ) -> None:
        super().__init__(target_port)
        self._random = random.Random(seed)
        self._cuts_left = cuts
        self._bounds = (min_bytes, max_bytes)
        self.cut_count = 0
        self.resets = 0
        self.connections = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        budget: int | None = None
        if self._cuts_left > 0:
            self._cuts_left -= 1
            budget = self._random.randint(*self._bounds)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._answer(up_reader, writer, budget)
            )
        except _Cut:
            pass
        finally:
            for end in (writer, up_writer):
                end.transport.abort()
                self._writers.discard(end)

    async def _answer(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, budget: int | None
    ) -> None:
        """Forward the answer; with a budget, cut it that many bytes after its head."""
        seen = b""
        body_start: int | None = None
        sent = 0
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                if budget is not None and body_start is None:
                    seen += data
                    end = seen.find(b"\r\n\r\n")
                    if end >= 0:
                        body_start = end + 4
                if budget is not None and body_start is not None:
                    limit = body_start + budget
                    if sent + len(data) > limit:
                        sink.write(data[: max(0, limit - sent)])
                        await sink.drain()
                        # every byte before the cut goes out before the close
                        while sink.transport.get_write_buffer_size():  # noqa: ASYNC110
                            await asyncio.sleep(0.001)
                        self._cut(sink)
                        raise _Cut
                sink.write(data)
                sent += len(data)
                await sink.drain()
        sink.transport.abort()

    def _cut(self, sink: asyncio.StreamWriter) -> None:
        self.cut_count += 1
        if self.cut_count % 2 == 0:
            self.resets += 1
            sock = sink.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
        sink.transport.abort()  # a FIN once the bytes above are out, or a reset with linger 0


@contextlib.contextmanager
def proxied(port: int) -> Iterator[FaultyProxy]:
    """A started ``FaultyProxy`` to ``127.0.0.1:port``."""
    with FaultyProxy(port) as proxy:
        yield proxy
