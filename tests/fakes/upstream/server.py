"""The fake upstream server: scripting, observation, lifecycle and the answer to each request."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from .. import capability_wire
from ..capability_wire import FakeVideo
from . import http_wire
from .answers import Wire, perform
from .anthropic_wire import AnthropicWire
from .behaviours import Behaviour, Respond
from .cache_accounting import PromptCache
from .gates import Gate, resolve
from .openai_wire import OpenAIWire
from .recording import RecordedRequest
from .responses_wire import ResponsesWire

__all__ = ["FakeUpstream"]


class FakeUpstream:
    """The fake server. See the package docstring.

    ``default`` answers requests when the queues are empty (for load tests and echo servers);
    without one, an unscripted request gets 400 and is kept in ``unscripted``. With
    ``prompt_cache`` an answer that scripts no usage reports what a prompt cache of the earlier
    requests would (``cache_accounting``; prefixes of at least ``cache_min_tokens``).
    """

    def __init__(
        self,
        *,
        default: Behaviour | None = None,
        host: str = "127.0.0.1",
        prompt_cache: bool = False,
        cache_min_tokens: int = 1024,
    ) -> None:
        self.host = host
        self.prompt_cache = PromptCache(cache_min_tokens) if prompt_cache else None
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
                loop.call_soon_threadsafe(resolve, future)

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

    # the capability endpoints (capability_wire) answer through these too
    _send = staticmethod(http_wire.send)
    _until_disconnect = staticmethod(http_wire.until_disconnect)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while self._stopping is not None and not self._stopping.is_set():
                request = await http_wire.read_request(reader)
                if request is None:
                    break
                self.requests.append(request)
                self._changed()
                keep_open = await self._answer(request, reader, writer)
                self._changed()
                if not keep_open:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, http_wire.Disconnected):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            if not writer.is_closing():
                writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._changed()

    async def _answer(
        self, request: RecordedRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False when the connection must not be reused."""
        kind = capability_wire.capability_kind(request)
        if kind is not None:
            self.active += 1
            try:
                return await capability_wire.answer(self, kind, request, reader, writer)
            except (ConnectionError, http_wire.Disconnected):
                self._note_disconnect(request)
                return False
            finally:
                self.active -= 1
        wire: Wire
        if request.method == "POST" and request.protocol == "openai":
            wire = OpenAIWire(request)
        elif request.method == "POST" and request.protocol == "anthropic":
            wire = AnthropicWire(request)
        elif request.method == "POST" and request.protocol == "responses":
            wire = ResponsesWire(request)
        else:
            request.outcome = "not found"
            await http_wire.send_json(writer, 404, {"error": {"message": "no such endpoint"}})
            return True
        behaviour = self._next(request)
        while isinstance(behaviour, Respond):
            behaviour = behaviour.choose(request)
        if behaviour is None:
            self.unscripted.append(request)
            request.outcome = "unscripted"
            body = wire.error_body(400, "fake upstream: no behaviour was scripted", None)
            await http_wire.send(writer, 400, {"content-type": "application/json"}, body)
            return True
        self.active += 1
        try:
            return await perform(self, behaviour, wire, request, reader, writer)
        except (ConnectionError, http_wire.Disconnected):
            self._note_disconnect(request)
            return False
        finally:
            self.active -= 1

    def _note_disconnect(self, request: RecordedRequest) -> None:
        """Count a client that left mid-answer (not one the server's own stop cut off)."""
        if self._stopping is None or not self._stopping.is_set():
            self.disconnects += 1
            request.outcome = "client disconnected"

    async def _hold(self, gate: Gate, reader: asyncio.StreamReader) -> None:
        """Wait for the gate; a client that leaves meanwhile ends the response."""
        opened = gate.enter()
        self._changed()  # gate.waiting grew: wake wait_until() callers
        watcher = asyncio.ensure_future(http_wire.until_disconnect(reader))
        try:
            await asyncio.wait({opened, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gate.leave(opened)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            self._changed()
        if not opened.done():
            opened.cancel()
            raise http_wire.Disconnected
