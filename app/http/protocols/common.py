"""What every standard protocol shares: runs started through the run manager, read back from
their event log.

A protocol here is a translation. It starts a run exactly as the native routes do
(``RunManager.start``: admission, the session lock, the record, the log), then reads the run's
wire events from the log, from a cursor, and says them in its own words. Nothing here runs an
agent or keeps a run's state: a reader on any worker sees the same log.

- ``event_document``: a wire event's ``{"type", "seq", "data", ...}`` object;
- ``Translator`` / ``TranslatingEncoder``: a protocol's per-event translation, as the
  ``FrameEncoder`` of ``app.http.api.streaming.EventStreamResponse`` (its streams);
- ``LogResultResponse``: a blocking answer, sent once the translation says it is complete;
- ``follow`` / ``snapshot``: the documents of a log, live until the end, or as they are now;
- ``cancel_on_disconnect``, ``session_of``, ``new_session_id``: small shared steps;
- ``check_text``, ``check_fields``, ``check_session_id`` (``RefusedValue``): the native run
  start's rules for what a client sends (text every store holds exactly, the session-id rule),
  named by each protocol's own field, for each protocol to refuse in its own shape;
- ``stream_run``, ``start_run``, ``disconnect_policy`` (a disconnect cancels the run wherever it
  runs), ``active_run`` / ``latest_run`` (a session's run, on any worker), ``read_log`` (what a
  run's log holds: its confirmations, answered or not), ``answer_confirmation``: the front-end
  protocols' steps (AG-UI, the AI SDK stream), whose streams end at a confirmation and whose
  next request answers it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESOLVED,
    CONFIRMATION_RESPONSE,
)
from agent_runtime.extensions.external import ExternalEvent
from app.bus.base import BusError, EventLog, LogNotFound, Router, WireEvent
from app.errors import InvalidRequest, NotFound, SessionBusy
from app.http.api.errors import problem_response
from app.http.api.schemas import SESSION_ID_RULE, is_session_id, unicode_text
from app.http.api.streaming import EventStreamResponse, FrameEncoder
from app.runs import RunHandle, RunManager, RunRequestOptions
from app.server.services import Services

__all__ = [
    "SSE_HEADERS",
    "Confirmation",
    "LogResultResponse",
    "LoggedRun",
    "RefusedValue",
    "TranslatingEncoder",
    "Translator",
    "active_run",
    "answer_confirmation",
    "busy_reason",
    "cancel_on_disconnect",
    "check_fields",
    "check_session_id",
    "check_text",
    "delta_string",
    "disconnect_policy",
    "dumps",
    "event_data",
    "event_document",
    "follow",
    "latest_run",
    "new_session_id",
    "read_log",
    "session_of",
    "snapshot",
    "start_run",
    "stream_run",
]

logger = logging.getLogger("app.http.protocols")

_DATA = b"\ndata: "
# a text.delta (or reasoning.delta) frame ends with its data object: ,"data":{"delta":"..."}}\n\n
# (inside a JSON string every quote is escaped, so this can only be the envelope's own key)
_DELTA_DATA = b',"data":'
_DELTAS = frozenset({"text.delta", "reasoning.delta"})
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
"""Compact JSON, as every protocol's frames carry it."""


def event_document(event: WireEvent) -> dict[str, Any]:
    """The wire event's JSON object (``type``, ``seq``, ``run_id``, ``session_id``, ``data``).

    A ``text.delta`` or ``reasoning.delta`` (most events) gets only ``type``, ``seq`` and
    ``data``: decoding just its small ``data`` object costs a fraction of the whole frame.
    """
    frame = event.frame
    if event.type in _DELTAS:
        start = frame.rfind(_DELTA_DATA)
        if start > 0:
            data = json.loads(frame[start + len(_DELTA_DATA) : -3])
            return {"type": event.type, "seq": event.seq, "data": data}
    start = frame.find(_DATA)
    if start < 0:  # pragma: no cover - every wire event has its data line
        return event.document
    value = json.loads(frame[start + len(_DATA) :])
    assert isinstance(value, dict)
    return value


def delta_string(event: WireEvent) -> bytes:
    """The ``delta`` of a ``text.delta`` or ``reasoning.delta`` as its frame holds it: a JSON
    string (or ``null``), for an encoder to re-frame without decoding it."""
    frame = event.frame
    # the frame ends with "data":{"delta":<JSON string>}}\n\n (see _DELTA_DATA)
    start = frame.rfind(_DELTA_DATA)
    return frame[start + len(_DELTA_DATA) + len(b'{"delta":') : -4]


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


class RefusedValue(InvalidRequest):
    """A value a client sent that the native run start would refuse too; ``param`` is the
    protocol's own name of the field (the OpenAI error's ``param``)."""

    def __init__(self, param: str, detail: str) -> None:
        super().__init__(detail)
        self.param = param


def check_text(param: str, value: Any) -> None:
    """Refuse (``RefusedValue``) what no store holds exactly, anywhere in ``value``: a lone
    surrogate, NUL, a number out of range (``app.http.api.schemas.unicode_text``).

    The same on every backend: SQLite would store a NUL that PostgreSQL cannot, and a lone
    surrogate fails every UTF-8 encoder (the database's, the stream's) after the run began.
    """
    try:
        unicode_text(value, where=param)
    except ValueError as exc:
        raise RefusedValue(param, str(exc)) from None


def check_fields(fields: Iterable[tuple[str, Any]]) -> None:
    """``check_text`` of each ``(name, value)``: a pydantic request model's fields, say."""
    for name, value in fields:
        check_text(name, value)


def check_session_id(param: str, value: str) -> str:
    """``value`` if it keeps the session-id rule of the native routes; else ``RefusedValue``.

    A session named otherwise would be stored and listed, and then be out of reach of
    ``GET`` / ``DELETE /v1/sessions/{session_id}``.
    """
    if not is_session_id(value):
        raise RefusedValue(param, f"{param}: {SESSION_ID_RULE} (it names the session)")
    return value


def new_session_id(prefix: str) -> str:
    """A fresh session id for a protocol request that names none (128 random bits)."""
    return f"{prefix}_{secrets.token_hex(16)}"


# --- the front-end protocols: a stream that ends at a confirmation, answered next time ---

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


_DATA_KEY = b',"data":'


def event_data(event: WireEvent) -> dict[str, Any]:
    """The ``data`` object of a wire event (decoded; the hot text path never needs it)."""
    frame = event.frame
    start = frame.find(_DATA_KEY)
    if start < 0:  # pragma: no cover - every wire frame has its data member last
        return {}
    value = json.loads(frame[start + len(_DATA_KEY) : frame.rindex(b"}")])
    return value if isinstance(value, dict) else {}


async def start_run(
    services: Services, principal: str, session_id: str, options: RunRequestOptions
) -> RunHandle:
    """Admit and start a run, exactly as ``POST /v1/sessions/{id}/runs`` does."""
    return await services.manager.start(principal, session_id, options)


# cancellations sent to another worker after a disconnect, held until they are delivered
_routed: set[asyncio.Task[bool]] = set()


def disconnect_policy(services: Services, run_id: str, policy: str) -> Callable[[], None] | None:
    """What a streaming client's disconnect does to the run: cancel it, or nothing.

    A stream that continues a run (a resume, an approval) may be served by a worker other than
    the run's: the cancellation then goes through the bus to the worker that holds it.
    """
    if policy != "cancel":
        return None
    manager = services.manager
    router = services.bus.router

    def cancel() -> None:
        if manager.local(run_id) is not None:
            manager.cancel_local(run_id, "client_disconnected")
            return
        task = asyncio.get_running_loop().create_task(_route_cancel(router, run_id))
        _routed.add(task)
        task.add_done_callback(_routed.discard)

    return cancel


async def _route_cancel(router: Router, run_id: str) -> bool:
    try:
        return await router.cancel(run_id, "client_disconnected")
    except BusError as exc:
        logger.warning("could not cancel run %s after a disconnect: %s", run_id, exc)
        return False


def stream_run(
    services: Services,
    run_id: str,
    encoder: FrameEncoder,
    *,
    after: int = 0,
    on_gone: Callable[[], object] | None = None,
    headers: Mapping[str, str] | None = None,
) -> EventStreamResponse:
    """The run's log from ``after``, in the encoder's frames."""
    return EventStreamResponse(
        events=services.bus.events,
        run_id=run_id,
        after=after,
        headers={**SSE_HEADERS, "X-Run-Id": run_id, **(headers or {})},
        ping=services.settings.sse_ping,
        send_timeout=services.settings.send_timeout,
        on_gone=on_gone,
        manager=services.manager,
        encoder=encoder,
    )


async def active_run(services: Services, session_id: str, principal: str) -> str | None:
    """The id of the session's active run (on any worker) if the caller owns it."""
    holder = await services.bus.locks.holder(session_id)
    if holder is None or not holder.startswith("run_"):
        return None  # idle, or held for a moment by a deletion or the lost-run sweep
    found = await services.manager.find(holder, principal)
    if found is None or found.session_id != session_id:
        return None
    return holder


async def latest_run(services: Services, session_id: str, principal: str) -> str | None:
    """The session's active run, else its most recent one; None if it has none (or is not
    the caller's)."""
    active = await active_run(services, session_id, principal)
    if active is not None:
        return active
    session = await services.store.get_session(session_id)
    if session is None or session.principal != principal:
        return None
    runs = await services.store.list_runs(session_id, 1)
    return runs[0].run_id if runs else None


async def busy_reason(services: Services, exc: SessionBusy, principal: str) -> str:
    """``interrupt_pending`` when the session's active run waits for an answer, else
    ``session_busy``."""
    active = exc.extra.get("active_run_id")
    if not isinstance(active, str):
        return "session_busy"
    found = await services.manager.find(active, principal)
    status: str | None = None
    if isinstance(found, RunHandle):
        status = services.manager.live_status(found)
    elif found is not None:
        status = found.status
    return "interrupt_pending" if status == "waiting" else "session_busy"


@dataclass
class Confirmation:
    """One confirmation a run asked for, as its log tells it."""

    tool_call_id: str
    seq: int
    payload: dict[str, Any]
    outcome: str | None = None  # approved, denied or expired, once resolved


@dataclass
class LoggedRun:
    """What a run's log holds so far: its model, confirmations and whether it ended."""

    run_id: str
    last_seq: int = 0
    model: str | None = None
    ended: bool = False
    confirmations: dict[str, Confirmation] = field(default_factory=dict)

    def pending(self) -> list[Confirmation]:
        """The confirmations still waiting for an answer."""
        if self.ended:
            return []
        return [c for c in self.confirmations.values() if c.outcome is None]


async def read_log(services: Services, run_id: str) -> LoggedRun:
    """Everything the run's log holds now (replayed once; raises ``NotFound`` once it expired)."""
    events = services.bus.events
    logged = LoggedRun(run_id)
    last = await events.last_seq(run_id)
    if last is None:
        raise NotFound(f"the events of run {run_id!r} are no longer kept (they expired)")
    if last == 0:
        return logged
    try:
        subscription = await events.subscribe(run_id, 0)
    except LogNotFound:
        raise NotFound(f"the events of run {run_id!r} are no longer kept") from None
    try:
        while subscription.cursor < last:
            batch = await subscription.next()
            if not batch:  # finished (nothing interrupts this reader)
                break
            _absorb(logged, batch)
    finally:
        await subscription.aclose()
    return logged


def _absorb(logged: LoggedRun, batch: Sequence[WireEvent]) -> None:
    for event in batch:
        logged.last_seq = event.seq
        if event.type == "run.started":
            model = event_data(event).get("model")
            logged.model = model if isinstance(model, str) else None
        elif event.type == "custom":
            data = event_data(event)
            payload = data.get("payload")
            if not isinstance(payload, dict):
                continue
            call_id = payload.get("tool_call_id")
            if not isinstance(call_id, str):
                continue
            if data.get("name") == CONFIRMATION_REQUESTED:
                logged.confirmations[call_id] = Confirmation(call_id, event.seq, payload)
            elif data.get("name") == CONFIRMATION_RESOLVED and call_id in logged.confirmations:
                outcome = payload.get("outcome")
                logged.confirmations[call_id].outcome = (
                    outcome if isinstance(outcome, str) else "denied"
                )
        elif event.terminal:
            logged.ended = True


async def answer_confirmation(
    services: Services,
    principal: str,
    session_id: str,
    run_id: str,
    tool_call_id: str,
    approved: bool,
    arguments: Mapping[str, Any] | None = None,
    *,
    reply: str | None = None,
) -> bool:
    """Deliver an approval or a denial to the waiting run, exactly as ``POST /external-events``
    does (the run holds the call; only an approval's ``arguments``, where its tool takes edits,
    change it; a denial's ``reply`` is what the model gets in the tool's place). False if no
    run took it."""
    payload: dict[str, Any] = {"tool_call_id": tool_call_id, "approved": approved}
    if arguments is not None:
        payload["arguments"] = dict(arguments)
    if reply is not None:
        payload["response"] = reply
    answer = ExternalEvent(CONFIRMATION_RESPONSE, payload)
    accepted = await services.manager.routing.external_event(principal, session_id, run_id, answer)
    return bool(accepted)
