"""The two responses that outlive their handler: an SSE stream of a run's log, and a blocking
run's JSON result.

Both are small ASGI responses written here rather than sse-starlette's ``EventSourceResponse``
(which only the benchmark's baseline uses, a development dependency): that one ends every
stream as soon as the server is told to stop, while a drain must let each stream deliver its
run's terminal event (the drain is ours to control), and it is slower (docs/benchmarks.md).
Each response:

- reads the run's log from its own cursor (replay, then live): ``Subscription.next()`` hands
  over every event already there, and a burst goes out in writes of at most ``PIECE_BYTES``:
  the server's write buffer pauses the next write until the client has read the last, so a
  client that reads slowly (or never) holds one piece, not the whole backlog;
- watches ``receive()`` for the client's disconnect in one small task;
- bounds each write by ``send_timeout``: a client that stops reading counts as gone, and its
  connection is aborted (``scope["extensions"]["agent.abort"]``, given by
  ``app.server.http_protocol``), which frees what the transport still buffers for it; on that
  server only a write while the transport is paused can wait (``agent.write_paused``), and only
  those arm the timer: the rest, nearly all, cost no timer each, and go out through that
  server's synchronous writer (``agent.body_writer``), not through every middleware's send;
- starts with a ``retry:`` field (``AGENT_SSE_RETRY_MS``), an EventSource's reconnect delay;
- sends ``: ping`` after ``ping`` seconds of silence;
- on a client gone before the terminal event, calls ``on_gone`` (the run's disconnect policy);
- ends without a terminal event, dropping the connection, when this worker loses the run's
  lease or its drain is over (``RunManager.drained``): the client resumes on another worker.

The stream sends the log's own SSE frames, or, with an ``encoder``, what that encoder makes of
them: the standard protocols (``app.http.protocols``) speak their own events over the same response.
An encoder whose stream may end before the log does, at a request for an answer that the
protocol answers with a request of its own (AG-UI's interrupt, the AI SDK's approval), is a
``PausingEncoder``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.bus.base import BusError, EventLog, LogNotFound, Subscription, WireEvent
from app.bus.wire import PING_FRAME
from app.http.api.errors import problem_response

if TYPE_CHECKING:
    from app.runs import RunHandle, RunManager

__all__ = [
    "PIECE_BYTES",
    "EventStreamResponse",
    "FrameEncoder",
    "PausingEncoder",
    "RunResultResponse",
]

logger = logging.getLogger("app.streaming")

# the largest write of a backlog: the transport's high-water mark (64 KiB), so that one
# stream never buffers much more than twice that in the process
PIECE_BYTES = 65_536


async def _reap(task: asyncio.Task[None]) -> None:
    """Wait for a cancelled helper task; its own failure (a broken receive) is not ours."""
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class _DirectWrites:
    """A stream's ``DirectReader``: each event the log takes while the stream waits, written
    to the client at once from the appending task (one wake-up an event fewer). It takes an
    event only when writing it is all there is to do: a single frame, not the run's last, no
    disconnect, fence or drain to act on, no reader renewal due, the transport not paused."""

    __slots__ = ("loop", "refresh", "renewed", "watch", "write")

    def __init__(
        self,
        write: Callable[[bytes], bool],
        watch: _StreamWatch,
        refresh: float | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.write = write
        self.watch = watch
        self.refresh = refresh
        self.loop = loop
        self.renewed = loop.time()

    def __call__(self, events: Sequence[WireEvent]) -> bool:
        watch = self.watch
        if len(events) != 1 or watch.gone or watch.fenced or watch.closing:
            return False
        event = events[0]
        frame = event.frame
        if event.terminal or len(frame) > PIECE_BYTES:
            return False
        now = self.loop.time()
        refresh = self.refresh
        if refresh is not None and now - self.renewed >= refresh:
            return False
        if not self.write(frame):
            return False
        watch.last_send = now
        return True


class _StreamWatch:
    """What wakes a stream waiting for its log: the client's disconnect, the run fenced off
    here, the end of this worker's drain, and ``ping`` seconds without a write."""

    def __init__(self, subscription: Subscription, ping: float) -> None:
        self._subscription = subscription
        self._ping = ping
        self._loop = asyncio.get_running_loop()
        self.gone = False
        self.fenced = False
        self.closing = False
        self.last_send = self._loop.time()
        self._ticker: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._fenced_off: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    def start(
        self,
        receive: Receive,
        fenced_off: asyncio.Future[None] | None,
        drained: asyncio.Future[None] | None,
    ) -> None:
        self._watcher = self._loop.create_task(_wait_disconnect(receive))
        self._watcher.add_done_callback(self._on_disconnect)
        self._fenced_off = fenced_off
        if fenced_off is not None:
            fenced_off.add_done_callback(self._on_fenced)
        self._drained = drained
        if drained is not None:
            drained.add_done_callback(self._on_drained)
        self._ticker = self._loop.call_later(self._ping, self._tick)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._watcher is not None:
            self._watcher.remove_done_callback(self._on_disconnect)
        if self._fenced_off is not None:
            self._fenced_off.remove_done_callback(self._on_fenced)
        if self._drained is not None:
            self._drained.remove_done_callback(self._on_drained)
        if self._watcher is not None:
            self._watcher.cancel()
            await _reap(self._watcher)

    def _on_disconnect(self, _: asyncio.Task[None]) -> None:
        self.gone = True
        self._subscription.interrupt()

    def _on_fenced(self, _: asyncio.Future[None]) -> None:
        self.fenced = True
        self._subscription.interrupt()

    def _on_drained(self, _: asyncio.Future[None]) -> None:
        self.closing = True
        self._subscription.interrupt()

    def _tick(self) -> None:
        idle = self._loop.time() - self.last_send
        if idle >= self._ping:
            self._subscription.interrupt()
            self._ticker = self._loop.call_later(self._ping, self._tick)
        else:
            self._ticker = self._loop.call_later(self._ping - idle, self._tick)


class FrameEncoder(Protocol):
    """Turns a run's wire events into the bytes another protocol's clients read."""

    def opening(self) -> bytes:
        """What the stream starts with, before any event (may be empty)."""
        ...

    def encode(self, events: Sequence[WireEvent]) -> bytes:
        """The frames for these events (empty when they mean nothing to the protocol)."""
        ...

    @property
    def done(self) -> bool:
        """True once the protocol's stream is over; it may end before the run does."""
        ...


@runtime_checkable
class PausingEncoder(FrameEncoder, Protocol):
    """A ``FrameEncoder`` whose stream ends at a request for an answer, while the run waits."""

    @property
    def paused(self) -> bool:
        """True when the last event encoded asks for an answer: the stream ends there unless
        the log already holds more (the answer came first)."""
        ...

    def pause(self) -> bytes:
        """The frames that end the stream at the pause (then ``done`` is True)."""
        ...


class EventStreamResponse(Response):
    """``text/event-stream`` of one run's events after ``after``, until its terminal event."""

    media_type = "text/event-stream"

    def __init__(
        self,
        *,
        events: EventLog,
        run_id: str,
        after: int = 0,
        headers: Mapping[str, str] | None = None,
        ping: float = 15.0,
        send_timeout: float = 30.0,
        on_gone: Callable[[], object] | None = None,
        manager: RunManager | None = None,
        encoder: FrameEncoder | None = None,
        retry_ms: int | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._encoder = encoder
        self._events = events
        self._run_id = run_id
        self._after = after
        self._ping = ping
        self._send_timeout = send_timeout
        self._on_gone = on_gone
        self._manager = manager
        # ``retry: N`` without the blank line that would end an event: it joins the first
        # event's block (a block of its own is an empty event to some clients, httpx-sse)
        self._opening = (
            b"" if retry_ms is None or encoder is not None else b"retry: %d\n" % retry_ms
        )
        self.init_headers(
            {"cache-control": "no-store", "x-accel-buffering": "no", **(headers or {})}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            subscription = await self._events.subscribe(self._run_id, self._after)
        except LogNotFound:
            response = problem_response(
                404, "not_found", f"the events of run {self._run_id!r} are no longer kept"
            )
            await response(scope, receive, send)
            return
        manager = self._manager
        if manager is not None:
            manager.stream_opened()
        extensions = scope.get("extensions") or {}
        paused = extensions.get("agent.write_paused")
        body_writer = extensions.get("agent.body_writer")
        try:
            # in a task of its own: each of a long stream's wake-ups then resumes the few
            # frames of the stream, not every middleware's above this response (a
            # cancellation of the request still reaches it: awaiting a task passes it on)
            streaming = asyncio.get_running_loop().create_task(
                self._stream(subscription, receive, send, paused, body_writer),
                name=f"sse:{self._run_id}",
            )
            aborted = await streaming
        finally:
            if manager is not None:
                manager.stream_closed()
        if aborted:
            abort = scope.get("extensions", {}).get("agent.abort")
            if abort is not None:
                abort()

    async def _stream(
        self,
        subscription: Subscription,
        receive: Receive,
        send: Send,
        write_paused: Callable[[], bool] | None = None,
        body_writer: Callable[[], Callable[[bytes], bool] | None] | None = None,
    ) -> bool:
        """Send the log until its end or the client's; True if the connection is to be dropped:
        a write timed out, or the stream ends early (fenced off, or this worker's drain is
        over) without a terminal event, which a client's transport reports as a cut, its cue
        to resume with ``Last-Event-ID``."""
        loop = asyncio.get_running_loop()
        completed = False
        timed_out = False
        cut = False  # ended before the run's end, for the client to resume elsewhere
        send_timeout = self._send_timeout
        encoder = self._encoder
        # (the check against a runtime-checkable protocol is costly: only with an encoder)
        pausing = encoder if encoder is not None and isinstance(encoder, PausingEncoder) else None
        # a run held here that gets fenced off (app.runs.fencing) ends its streams without a
        # terminal event: the client resumes on another worker, which tells the real end
        handle = self._manager.local(self._run_id) if self._manager is not None else None
        # this worker's drain is over: once caught up with the log, the stream ends without a
        # terminal event and its client resumes with Last-Event-ID elsewhere (or here after
        # the restart); uvicorn would otherwise hold the shutdown until it gave up on it
        drained = self._manager.drained() if self._manager is not None else None
        watch = _StreamWatch(subscription, self._ping)
        # the reader renews its attach mark while it reads: a run resumed on another worker
        # then knows its client still reads it (app.runs.grace)
        manager = self._manager
        refresh = manager.reader_refresh if manager is not None else None
        renewed = loop.time()
        watch.start(receive, handle.fenced_off if handle is not None else None, drained)
        try:
            async with asyncio.timeout(send_timeout):
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
                opening = encoder.opening() if encoder is not None else self._opening
                if opening:
                    await send({"type": "http.response.body", "body": opening, "more_body": True})
            # the head is out: the server's writer of the next chunks, if it offers one
            write = body_writer() if body_writer is not None else None
            direct: _DirectWrites | None = None
            if write is not None and encoder is None and hasattr(subscription, "direct"):
                # the log's own frames: written from the appending task while this one waits
                direct = _DirectWrites(write, watch, refresh, loop)
                direct.renewed = renewed
                subscription.direct = direct
            while True:
                batch = await subscription.next()
                if watch.gone:
                    break
                if refresh is not None and manager is not None:
                    now = loop.time()
                    if now - renewed >= refresh:
                        renewed = now
                        if direct is not None:
                            direct.renewed = now
                        _renew(manager.reader_alive(self._run_id))
                if self._ends_early(watch, batch, subscription):
                    cut = True
                    break
                last = await self._last_write(encoder, pausing, batch, subscription, send, watch)
                if last is None:
                    continue
                body, more = last
                # most writes complete without waiting: written at once, below the
                # middleware's send wrappers (which have nothing to do with a body); the
                # deadline only bites when the client stopped reading and the server's
                # buffers are full
                if more and write is not None and write(body):
                    watch.last_send = loop.time()
                    continue
                message = {"type": "http.response.body", "body": body, "more_body": more}
                if write_paused is not None and not write_paused():
                    await send(message)  # the transport takes it now: nothing to wait for
                else:
                    async with asyncio.timeout(send_timeout):
                        await send(message)
                if not more:
                    completed = True
                    break
                watch.last_send = loop.time()
        except TimeoutError:
            watch.gone = True  # a write blocked for send_timeout: the client is not reading
            timed_out = True
        except OSError:
            watch.gone = True  # servers implementing ASGI 2.4 raise it for a closed connection
        except BusError as exc:
            # the shared log is out of reach (Redis down): end this response; the client
            # resumes with Last-Event-ID once it is back, and the run's fate is the bus's
            logger.warning("event stream of run %s ended: %s", self._run_id, exc)
        finally:
            if hasattr(subscription, "direct"):
                subscription.direct = None
            await watch.stop()
            await subscription.aclose()
            if watch.gone and not completed and self._on_gone is not None:
                self._on_gone()
        return timed_out or cut

    def _ends_early(
        self, watch: _StreamWatch, batch: Sequence[WireEvent], subscription: Subscription
    ) -> bool:
        """Whether the stream ends here without its terminal event (fenced off, or drained)."""
        if watch.fenced:
            logger.warning(
                "event stream of run %s ended: this worker lost the run's lease", self._run_id
            )
            return True
        if watch.closing and not batch and not subscription.finished:
            logger.info("event stream of run %s ended: this worker is shutting down", self._run_id)
            return True
        return False

    async def _last_write(
        self,
        encoder: FrameEncoder | None,
        pausing: PausingEncoder | None,
        batch: Sequence[WireEvent],
        subscription: Subscription,
        send: Send,
        watch: _StreamWatch,
    ) -> tuple[bytes, bool] | None:
        """Send a batch but its last write, which is returned with whether the stream goes on;
        None when there is nothing more to write for this batch."""
        send_timeout = self._send_timeout
        if encoder is not None:
            body, more = await self._translate(encoder, pausing, batch, subscription)
            if not body and more:
                return None  # events this protocol does not show
            if len(body) > PIECE_BYTES:
                # a large translation goes out in pieces too, the transport
                # draining between them
                *head, body = _slices(body)
                for piece in head:
                    async with asyncio.timeout(send_timeout):
                        await send({"type": "http.response.body", "body": piece, "more_body": True})
            return body, more
        if len(batch) == 1 and len(batch[0].frame) <= PIECE_BYTES:
            return batch[0].frame, not subscription.finished
        if batch:
            # a backlog, in pieces made one at a time: each goes out once the client
            # took the one before (uvicorn waits for its transport to drain; once
            # the client is gone, its sends return at once)
            for piece in _pieces(batch):
                async with asyncio.timeout(send_timeout):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            watch.last_send = asyncio.get_running_loop().time()
            if not subscription.finished:
                return None
            return b"", False
        return (b"" if subscription.finished else PING_FRAME), not subscription.finished

    async def _translate(
        self,
        encoder: FrameEncoder,
        pausing: PausingEncoder | None,
        batch: Sequence[WireEvent],
        subscription: Subscription,
    ) -> tuple[bytes, bool]:
        """The encoder's frames for a batch, and whether the stream goes on."""
        if not batch:
            if subscription.finished or encoder.done:
                return b"", False
            return PING_FRAME, True
        body = encoder.encode(batch)
        if pausing is not None and pausing.paused and not pausing.done:
            # a request for an answer ends the protocol's stream, unless its answer (or the
            # run's end) is already logged: then this is history being replayed
            last = await self._events.last_seq(self._run_id)
            if last is None or last <= subscription.cursor:
                body += pausing.pause()
        return body, not (encoder.done or subscription.finished)


# renewals of readers' marks in flight, kept until they end (never cancelled: a Redis call
# cut half-way would cost its connection)
_renewals: set[asyncio.Task[None]] = set()


def _renew(renewal: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(renewal)
    _renewals.add(task)
    task.add_done_callback(_renewals.discard)


def _slices(body: bytes) -> list[bytes]:
    """``body`` cut into pieces of at most ``PIECE_BYTES``."""
    return [body[start : start + PIECE_BYTES] for start in range(0, len(body), PIECE_BYTES)]


def _pieces(batch: Sequence[WireEvent]) -> Iterator[bytes]:
    """The frames of ``batch`` in pieces of at most ``PIECE_BYTES``, made as they are asked
    for: small frames joined, a large one cut (a client's parser reassembles its lines)."""
    group: list[bytes] = []
    size = 0
    for event in batch:
        frame = event.frame
        if size + len(frame) > PIECE_BYTES and group:
            yield b"".join(group)
            group, size = [], 0
        if len(frame) > PIECE_BYTES:
            view = memoryview(frame)
            for start in range(0, len(frame), PIECE_BYTES):
                yield bytes(view[start : start + PIECE_BYTES])
            continue
        group.append(frame)
        size += len(frame)
    if group:
        yield b"".join(group)


class RunResultResponse(Response):
    """A blocking run's JSON result, sent when the run ends.

    A client that disconnects first calls ``on_gone`` (the run's disconnect policy).
    """

    media_type = "application/json"

    def __init__(
        self,
        *,
        manager: RunManager,
        handle: RunHandle,
        headers: Mapping[str, str] | None = None,
        on_gone: Callable[[], object] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._manager = manager
        self._handle = handle
        self._on_gone = on_gone
        self._extra_headers = dict(headers or {})
        self.init_headers(self._extra_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handle = self._handle
        manager = self._manager
        manager.open_waiters += 1
        watcher = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
        try:
            await asyncio.wait([handle.finished, watcher], return_when=asyncio.FIRST_COMPLETED)
        finally:
            manager.open_waiters -= 1
            watcher.cancel()
            await _reap(watcher)
        if not handle.done:
            if self._on_gone is not None:
                self._on_gone()
            return
        encoded = json.dumps(handle.result(), ensure_ascii=False, separators=(",", ":")).encode()
        headers = [*self.raw_headers, (b"content-length", str(len(encoded)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": encoded})
