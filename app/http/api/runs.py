"""Runs: start one (streamed, blocking or background), read it, follow its events, cancel it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.bus.base import BusError
from app.files.intake import RunInput, discard_input, take_input
from app.http.api.errors import ProblemError
from app.http.api.parts import shown_parts
from app.http.api.schemas import (
    BackgroundAccepted,
    CancelAnswer,
    Problem,
    RunRequest,
    RunResult,
    RunView,
    SessionId,
)
from app.http.api.streaming import EventStreamResponse, RunResultResponse
from app.runs import RunHandle, RunRequestOptions, record_view
from app.runs.branches import check_branch_from
from app.runs.idempotency import Claim, check_key, fingerprint
from app.runs.multitask import QueuedRun
from app.server.services import Services, ServicesDep
from app.storage import RunRecord

__all__ = ["router"]

router = APIRouter(tags=["runs"])

logger = logging.getLogger("app.http.api")

Principal = Annotated[str, Depends(principal_of)]

_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {"application/problem+json": {}}}
    for status in (401, 404, 409, 413, 415, 422, 429, 503)
}


def _not_found(run_id: str) -> ProblemError:
    return ProblemError(404, "not_found", f"no run {run_id!r}")


def _check_run_id(run_id: str) -> None:
    if not _RUN_ID.match(run_id):
        raise _not_found(run_id)


_IDEMPOTENCY_KEY = Header(
    alias="Idempotency-Key",
    pattern=r"^[ -~]{1,255}$",
    description="Up to 255 printable ASCII characters: a repeat of this request (same key, "
    "body and caller) within AGENT_IDEMPOTENCY_TTL starts nothing and attaches to the first "
    "run (header Idempotent-Replayed: true)",
)
_LAST_EVENT_ID = Header(
    alias="Last-Event-ID",
    pattern=r"^\s*[0-9]{0,18}\s*$",
    description="The seq of the last event received (the SSE id)",
)


def _cursor(last_event_id: str | None, after: int | None) -> int:
    """Where a reader resumes: ``Last-Event-ID`` if given, else ``?after=``, else 0."""
    if last_event_id is not None and last_event_id.strip():
        return int(last_event_id.strip())  # the header's pattern admits digits only
    return after or 0


def events_url(services: Services, run_id: str, principal: str) -> str:
    """The run's ``events_url``; with authentication on, with a stream token (for a
    browser's EventSource, which cannot send the API key)."""
    url = f"/v1/runs/{run_id}/events"
    tokens = services.stream_tokens
    if tokens is None:
        return url
    return f"{url}?token={tokens.issue(run_id, principal)}"


def _is_live(found: RunHandle | RunRecord) -> bool:
    return not found.done if isinstance(found, RunHandle) else not found.is_finished


async def _event_stream(
    services: Services,
    run_id: str,
    cursor: int,
    headers: dict[str, str],
    on_gone: Callable[[], None] | None = None,
) -> Response:
    """The run's events after ``cursor``; 204 once the reader has the terminal event (the
    answer that makes an EventSource stop reconnecting), 404 when the log expired."""
    events = services.bus.events
    terminal = await events.terminal_seq(run_id)
    if terminal is not None and cursor >= terminal:
        return Response(status_code=204, headers=headers)
    if terminal is None and not await events.exists(run_id):
        raise ProblemError(
            404, "not_found", f"the events of run {run_id!r} are no longer kept (they expired)"
        )
    settings = services.settings
    return EventStreamResponse(
        events=events,
        run_id=run_id,
        after=cursor,
        headers=headers,
        ping=settings.sse_ping,
        send_timeout=settings.send_timeout,
        on_gone=on_gone,
        manager=services.manager,
        retry_ms=settings.sse_retry_ms,
    )


_FINGERPRINT_OFFLOAD = 64 * 1024
# a part's URL longer than this is hashed on its own, in a thread, before the body's
# canonical JSON is (a data URL may be tens of megabytes, which one json.dumps call would
# encode holding the GIL)


async def _fingerprint(session_id: str, body: RunRequest) -> str:
    """The request's Idempotency-Key fingerprint: its session and its whole body, parts
    (data URLs included: by their SHA-256) too."""
    data = body.model_dump(mode="json")
    if not isinstance(body.input, str):
        for part in data["input"]:
            url = part.get("url")
            if isinstance(url, str) and len(url) > _FINGERPRINT_OFFLOAD:
                part["url"] = f"sha256:{await asyncio.to_thread(_digest, url)}"
    return fingerprint(session_id, data)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _input_value(body: RunRequest) -> str | list[dict[str, Any]]:
    """The request's input as ``take_input`` reads it: the string, or the parts' fields."""
    if isinstance(body.input, str):
        return body.input
    return [part.model_dump(exclude_none=True) for part in body.input]


def _options(body: RunRequest, taken: RunInput) -> RunRequestOptions:
    """The run's options: the request's, with its input as taken (text and parts)."""
    return RunRequestOptions(
        input=taken.text,
        parts=taken.parts,
        agent=body.agent,
        background=body.background,
        on_disconnect=body.on_disconnect,
        run_timeout=body.run_timeout,
        max_iterations=body.max_iterations,
        metadata=body.metadata or {},
        replaces=body.replaces,
        branch_from=body.branch_from,
        skill=body.skill,
        response_format=body.response_format.runtime_form() if body.response_format else None,
        multitask_strategy=body.multitask_strategy,
        webhook_url=body.webhook_url,
    )


@router.post(
    "/v1/sessions/{session_id}/runs",
    summary="Start a run",
    response_model=RunResult,
    responses={
        200: {
            "description": "The run's events (text/event-stream) or, with stream: false, "
            "its result",
            "content": {"text/event-stream": {}},
        },
        202: {"model": BackgroundAccepted, "description": "background: true"},
        204: {"description": "An idempotent repeat whose Last-Event-ID is the terminal event"},
        **_PROBLEMS,
    },
)
async def start_run(
    session_id: SessionId,
    body: RunRequest,
    principal: Principal,
    services: ServicesDep,
    idempotency_key: Annotated[str | None, _IDEMPOTENCY_KEY] = None,
    last_event_id: Annotated[str | None, _LAST_EVENT_ID] = None,
) -> Response:
    """Start a run in the session (created on first use, owned by the caller)."""
    manager = services.manager
    claim: Claim | None = None
    if idempotency_key is not None:
        key = check_key(idempotency_key)
        claim = await manager.idempotency.claim(
            principal, key, await _fingerprint(session_id, body)
        )
        if claim.run_id is not None:
            return await _replay(services, principal, body, claim.run_id, last_event_id)
    taken: RunInput | None = None
    try:
        if body.branch_from is not None:
            await check_branch_from(services.store, principal, session_id, body.branch_from)
        # after the key's claim: a repeat of the request stores none of its data URLs again
        taken = await take_input(services.files, principal, _input_value(body), limits=None)
        handle = await manager.submit(principal, session_id, _options(body, taken))
    except BaseException:
        if claim is not None:
            # nothing started: a retry with the key may start the run
            with contextlib.suppress(BusError):
                await manager.idempotency.give_up(claim)
        if taken is not None and taken.stored and services.files is not None:
            await asyncio.shield(discard_input(services.files, principal, taken))
        raise
    run_id = handle.run_id
    if claim is not None:
        try:
            await manager.idempotency.complete(claim, run_id)
        except BusError as exc:
            # the run is started and this answer names it; a repeat meanwhile waits for the
            # pending claim to lapse (409 idempotency_key_in_flight) rather than start another
            logger.warning("idempotency key of run %s not recorded: %s", run_id, exc)
    headers = {"X-Run-Id": run_id}
    if isinstance(handle, QueuedRun):  # background, waiting in the session's queue
        return JSONResponse(
            {
                "run_id": run_id,
                "status": "queued",
                "queue_position": handle.position,
                "events_url": events_url(services, run_id, principal),
            },
            status_code=202,
            headers={**headers, "Location": f"/v1/runs/{run_id}"},
        )
    if body.background:
        return _accepted(services, principal, run_id, manager.live_status(handle), headers)
    on_gone = manager.on_disconnect(run_id) if body.on_disconnect == "cancel" else None
    if body.stream:
        return EventStreamResponse(
            events=services.bus.events,
            run_id=run_id,
            headers=headers,
            ping=services.settings.sse_ping,
            send_timeout=services.settings.send_timeout,
            on_gone=on_gone,
            manager=manager,
            retry_ms=services.settings.sse_retry_ms,
        )
    return RunResultResponse(manager=manager, handle=handle, headers=headers, on_gone=on_gone)


def _accepted(
    services: Services, principal: str, run_id: str, status: str, headers: dict[str, str]
) -> Response:
    """The 202 of a background run."""
    return JSONResponse(
        {
            "run_id": run_id,
            "status": status,
            "events_url": events_url(services, run_id, principal),
        },
        status_code=202,
        headers={**headers, "Location": f"/v1/runs/{run_id}"},
    )


async def _replay(
    services: Services,
    principal: str,
    body: RunRequest,
    run_id: str,
    last_event_id: str | None,
) -> Response:
    """A repeat of a start with the same Idempotency-Key: the first run's answer, in the
    shape this request asks for, and nothing started."""
    manager = services.manager
    found = await manager.find(run_id, principal)
    if found is None:  # its session was deleted since
        raise ProblemError(
            404, "not_found", f"the run {run_id!r} this Idempotency-Key started no longer exists"
        )
    headers = {"X-Run-Id": run_id, "Idempotent-Replayed": "true"}
    live = _is_live(found)
    if body.background:
        status = manager.live_status(found) if isinstance(found, RunHandle) else found.status
        return _accepted(services, principal, run_id, status, headers)
    if live:  # a reader that came back: the first response's disconnect grace sees it
        await manager.reader_attached(run_id)
    on_gone = manager.on_disconnect(run_id) if live and body.on_disconnect == "cancel" else None
    if body.stream:
        return await _event_stream(services, run_id, _cursor(last_event_id, None), headers, on_gone)
    if isinstance(found, RunHandle):
        return RunResultResponse(manager=manager, handle=found, headers=headers, on_gone=on_gone)
    if not found.is_finished:
        found = await _await_record(services, run_id, principal)
    return JSONResponse(result_of(found), headers=headers)


async def _await_record(services: Services, run_id: str, principal: str) -> RunRecord:
    """The stored run once its log (written by another worker) holds its terminal event."""
    subscription = await services.bus.events.subscribe(run_id, 0)
    try:
        while not subscription.finished:
            await subscription.next()
    finally:
        await subscription.aclose()
    found = await services.manager.find(run_id, principal)
    if not isinstance(found, RunRecord):
        raise _not_found(run_id)
    return found


def result_of(record: RunRecord) -> dict[str, Any]:
    """The JSON answer of a blocking run, from its record."""
    return {
        "run_id": record.run_id,
        "session_id": record.session_id,
        "status": record.status,
        "output": record.output,
        "error": record.error,
        "usage": record.usage,
    }


@router.get(
    "/v1/runs/{run_id}",
    summary="A run's status and result",
    response_model=RunView,
    responses={404: _PROBLEMS[404], 401: _PROBLEMS[401]},
)
async def get_run(run_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The run's status and, once it ended, its output, error and usage."""
    _check_run_id(run_id)
    manager = services.manager
    found = await manager.find(run_id, principal)
    if found is None:
        queued = await manager.queued_view(run_id, principal)
        if queued is None:
            raise _not_found(run_id)
        queued["events_url"] = events_url(services, run_id, principal)
        queued["input_parts"] = shown_parts(queued.get("input_parts"))
        return JSONResponse(queued)
    view = manager.handle_view(found) if isinstance(found, RunHandle) else record_view(found)
    view["events_url"] = events_url(services, run_id, principal)
    view["input_parts"] = shown_parts(view.get("input_parts"))
    return JSONResponse(view)


async def _reader_of(request: Request, run_id: str, services: ServicesDep) -> str:
    """The principal reading a run's events: the API key's, or a stream token's for this
    run (``?token=``, what a browser's EventSource can send)."""
    authorization = request.headers.get("authorization")
    token = request.query_params.get("token")
    tokens = services.stream_tokens
    if authorization or token is None or tokens is None:
        return await principal_of(request)
    _check_run_id(run_id)
    return tokens.principal(token, run_id)


@router.get(
    "/v1/runs/{run_id}/events",
    summary="Follow a run's events",
    responses={
        200: {"description": "text/event-stream", "content": {"text/event-stream": {}}},
        204: {"description": "The reader already has the run's terminal event: nothing more"},
        404: _PROBLEMS[404],
        401: _PROBLEMS[401],
        422: _PROBLEMS[422],
    },
)
async def run_events(
    run_id: str,
    principal: Annotated[str, Depends(_reader_of)],
    services: ServicesDep,
    after: Annotated[int | None, Query(ge=0, description="Replay events after this seq")] = None,
    last_event_id: Annotated[str | None, _LAST_EVENT_ID] = None,
    token: Annotated[
        str | None,
        Query(
            description="A stream token from the run's events_url (authentication on): for "
            "clients that cannot send Authorization, such as a browser's EventSource"
        ),
    ] = None,
) -> Response:
    """Replay the events after ``Last-Event-ID`` (or ``?after=N``), then follow them live
    until the terminal event; 204 when the reader already has it."""
    _check_run_id(run_id)
    found = await services.manager.find(run_id, principal)
    if found is None:  # a run waiting in its session's queue is followed once it starts
        found = await services.manager.find_after_queue(run_id, principal)
    if found is None:
        raise _not_found(run_id)
    if _is_live(found):
        await services.manager.reader_attached(run_id)  # the disconnect grace sees it
    return await _event_stream(
        services, run_id, _cursor(last_event_id, after), {"X-Run-Id": run_id}
    )


@router.post(
    "/v1/runs/{run_id}/cancel",
    summary="Cancel a run",
    response_model=CancelAnswer,
    status_code=202,
    responses={
        200: {"model": CancelAnswer, "description": "Already finished"},
        404: _PROBLEMS[404],
    },
)
async def cancel_run(run_id: str, principal: Principal, services: ServicesDep) -> Response:
    """Cancel the run (reason ``cancel_requested``); idempotent."""
    _check_run_id(run_id)
    answer = await services.manager.cancel(run_id, principal)
    if answer is None:
        raise _not_found(run_id)
    state, status = answer
    if state == "finished":
        return JSONResponse({"run_id": run_id, "status": status}, status_code=200)
    return JSONResponse({"run_id": run_id, "status": "cancelling"}, status_code=202)
