"""What every standard protocol shares: runs started through the run manager, read back from
their event log.

A protocol here is a translation. It starts a run exactly as the native routes do
(``RunManager.start``: admission, the session lock, the record, the log), then reads the run's
wire events from the log, from a cursor, and says them in its own words. Nothing here runs an
agent or keeps a run's state: a reader on any worker sees the same log.

- ``event_document``: a wire event's ``{"type", "seq", "data", ...}`` object;
- ``Translator`` / ``TranslatingEncoder``: a protocol's per-event translation, as the
  ``FrameEncoder`` of ``app.api.streaming.EventStreamResponse`` (its streams);
- ``LogResultResponse``: a blocking answer, sent once the translation says it is complete;
- ``follow`` / ``snapshot``: the documents of a log, live until the end, or as they are now;
- ``cancel_on_disconnect``, ``session_of``, ``new_session_id``: small shared steps.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.api.errors import problem_response
from app.bus.base import EventLog, LogNotFound, WireEvent
from app.errors import NotFound
from app.runs import RunHandle, RunManager

__all__ = [
    "LogResultResponse",
    "TranslatingEncoder",
    "Translator",
    "cancel_on_disconnect",
    "dumps",
    "event_document",
    "follow",
    "new_session_id",
    "session_of",
    "snapshot",
]

_DATA = b"\ndata: "
# a text.delta frame ends with its data object: ,"data":{"delta":"..."}}\n\n (inside a JSON
# string every quote is escaped, so this sequence can only be the envelope's own key)
_DELTA_DATA = b',"data":'
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
"""Compact JSON, as every protocol's frames carry it."""


def event_document(event: WireEvent) -> dict[str, Any]:
    """The wire event's JSON object (``type``, ``seq``, ``run_id``, ``session_id``, ``data``).

    A ``text.delta`` (most events) gets only ``type``, ``seq`` and ``data``: decoding just its
    small ``data`` object costs a fraction of the whole frame.
    """
    frame = event.frame
    if event.type == "text.delta":
        start = frame.rfind(_DELTA_DATA)
        if start > 0:
            data = json.loads(frame[start + len(_DELTA_DATA) : -3])
            return {"type": "text.delta", "seq": event.seq, "data": data}
    start = frame.find(_DATA)
    if start < 0:  # pragma: no cover - every wire event has its data line
        return event.document
    value = json.loads(frame[start + len(_DATA) :])
    assert isinstance(value, dict)
    return value


class Translator(Protocol):
    """One protocol's reading of one run's events (a stream, or the pieces of an answer)."""

    def opening(self) -> bytes:
        """The frames that open the protocol's stream, before any event."""
        ...

    def feed(self, document: Mapping[str, Any]) -> bytes:
        """Take the next wire event; the frames it makes (possibly none)."""
        ...

    @property
    def done(self) -> bool:
        """True once the protocol's answer is complete (at the run's end, or before)."""
        ...


class TranslatingEncoder:
    """A ``Translator`` as the encoder of an ``EventStreamResponse``."""

    __slots__ = ("_translator",)

    def __init__(self, translator: Translator) -> None:
        self._translator = translator

    def opening(self) -> bytes:
        return self._translator.opening()

    def encode(self, events: Sequence[WireEvent]) -> bytes:
        translator = self._translator
        out: list[bytes] = []
        for event in events:
            if translator.done:
                break  # the protocol's stream ended; what follows is not its
            frames = translator.feed(event_document(event))
            if frames:
                out.append(frames)
        return b"".join(out)

    @property
    def done(self) -> bool:
        return self._translator.done


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _feed(translator: Translator, events: Sequence[WireEvent]) -> bool:
    """Give the translator these events, up to the end of its answer; True once it is done."""
    for event in events:
        if translator.done:
            break
        translator.feed(event_document(event))
    return translator.done


class LogResultResponse(Response):
    """A JSON answer made from a run's log: sent once ``translator.done`` (or the log ends).

    ``result()`` gives its status and body then.
        The request's own disconnect before that calls ``on_gone`` (the run's disconnect policy).
    """

    media_type = "application/json"

    def __init__(
        self,
        *,
        events: EventLog,
        run_id: str,
        translator: Translator,
        result: Callable[[], tuple[int, Mapping[str, Any]]],
        after: int = 0,
        headers: Mapping[str, str] | None = None,
        on_gone: Callable[[], object] | None = None,
        manager: RunManager | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._events = events
        self._run_id = run_id
        self._translator = translator
        self._result = result
        self._after = after
        self._on_gone = on_gone
        self._manager = manager
        self.init_headers(dict(headers or {}))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self._manager
        if manager is not None:
            manager.open_waiters += 1
        loop = asyncio.get_running_loop()
        try:
            subscription = await self._events.subscribe(self._run_id, self._after)
        except LogNotFound:
            if manager is not None:
                manager.open_waiters -= 1
            detail = f"the events of run {self._run_id!r} are no longer kept"
            await problem_response(404, "not_found", detail, path=scope["path"])(
                scope, receive, send
            )
            return
        gone = False

        def on_disconnect(_: asyncio.Task[None]) -> None:
            nonlocal gone
            gone = True
            subscription.interrupt()

        watcher = loop.create_task(_wait_disconnect(receive))
        watcher.add_done_callback(on_disconnect)
        translator = self._translator
        try:
            while not subscription.finished and not _feed(translator, await subscription.next()):
                if gone:
                    break
        finally:
            if manager is not None:
                manager.open_waiters -= 1
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
            await asyncio.wait([watcher])
            if not watcher.cancelled():
                watcher.exception()
            await subscription.aclose()
        if gone:
            if self._on_gone is not None:
                self._on_gone()
            return
        status, body = self._result()
        encoded = dumps(body).encode()
        headers = [*self.raw_headers, (b"content-length", str(len(encoded)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": encoded})


async def follow(events: EventLog, run_id: str, after: int = 0) -> AsyncIterator[dict[str, Any]]:
    """The documents of the run's events after ``after``, live, until its terminal event.

    Raises ``NotFound`` when the log is gone (expired). Closing the iterator stops reading.
    """
    try:
        subscription = await events.subscribe(run_id, after)
    except LogNotFound:
        raise NotFound(f"the events of run {run_id!r} are no longer kept") from None
    try:
        while not subscription.finished:
            for event in await subscription.next():
                yield event_document(event)
    finally:
        await subscription.aclose()


async def snapshot(events: EventLog, run_id: str, after: int = 0) -> list[dict[str, Any]] | None:
    """The documents the run's log holds now after ``after``; None if it is gone."""
    last = await events.last_seq(run_id)
    if last is None:
        return None
    if last <= after:
        return []
    try:
        subscription = await events.subscribe(run_id, after)
    except LogNotFound:
        return None
    found: list[dict[str, Any]] = []
    try:
        while subscription.cursor < last and not subscription.finished:
            batch = await subscription.next()
            found.extend(event_document(event) for event in batch)
    finally:
        await subscription.aclose()
    return found


def cancel_on_disconnect(manager: RunManager, handle: RunHandle) -> Callable[[], None]:
    """The ``on_gone`` of a request that owns its run: cancel it (``client_disconnected``)."""
    run_id = handle.run_id

    def cancel() -> None:
        manager.cancel_local(run_id, "client_disconnected")

    return cancel


async def session_of(manager: RunManager, run_id: str, principal: str) -> str:
    """The session of the caller's run ``run_id``; ``NotFound`` if there is none."""
    found = await manager.find(run_id, principal)
    if found is None:
        raise NotFound(f"no run {run_id!r}")
    return found.session_id


def new_session_id(prefix: str) -> str:
    """A fresh session id for a protocol request that names none (128 random bits)."""
    return f"{prefix}_{secrets.token_hex(16)}"
