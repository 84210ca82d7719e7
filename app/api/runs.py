"""Runs: start one (streamed, blocking or background), read it, follow its events, cancel it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from starlette.responses import JSONResponse, Response

from app.api.errors import ProblemError
from app.api.schemas import (
    BackgroundAccepted,
    CancelAnswer,
    Problem,
    RunRequest,
    RunResult,
    RunView,
    SessionId,
)
from app.api.streaming import EventStreamResponse, RunResultResponse
from app.auth import principal_of
from app.runs import RunHandle, RunRequestOptions, record_view
from app.runs.multitask import QueuedRun
from app.services import Services, ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["runs"])

Principal = Annotated[str, Depends(principal_of)]

_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "content": {"application/problem+json": {}}}
    for status in (401, 404, 409, 413, 422, 429, 503)
}


def _not_found(run_id: str) -> ProblemError:
    return ProblemError(404, "not_found", f"no run {run_id!r}")


def _check_run_id(run_id: str) -> None:
    if not _RUN_ID.match(run_id):
        raise _not_found(run_id)


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
        **_PROBLEMS,
    },
)
async def start_run(
    session_id: SessionId, body: RunRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run in the session (created on first use, owned by the caller)."""
    manager = services.manager
    settings = services.settings
    options = RunRequestOptions(
        input=body.input,
        agent=body.agent,
        background=body.background,
        on_disconnect=body.on_disconnect,
        run_timeout=body.run_timeout,
        max_iterations=body.max_iterations,
        metadata=body.metadata or {},
        replaces=body.replaces,
        multitask_strategy=body.multitask_strategy,
    )
    handle = await manager.submit(principal, session_id, options)
    run_id = handle.run_id
    headers = {"X-Run-Id": run_id}
    if isinstance(handle, QueuedRun):  # background, waiting in the session's queue
        return JSONResponse(
            {
                "run_id": run_id,
                "status": "queued",
                "queue_position": handle.position,
                "events_url": f"/v1/runs/{run_id}/events",
            },
            status_code=202,
            headers={**headers, "Location": f"/v1/runs/{run_id}"},
        )
    if body.background:
        return JSONResponse(
            {
                "run_id": run_id,
                "status": manager.live_status(handle),
                "events_url": f"/v1/runs/{run_id}/events",
            },
            status_code=202,
            headers={**headers, "Location": f"/v1/runs/{run_id}"},
        )
    on_gone = _disconnect_policy(services, handle, body.on_disconnect)
    if body.stream:
        return EventStreamResponse(
            events=services.bus.events,
            run_id=run_id,
            headers=headers,
            ping=settings.sse_ping,
            send_timeout=settings.send_timeout,
            on_gone=on_gone,
            manager=manager,
        )
    return RunResultResponse(manager=manager, handle=handle, headers=headers, on_gone=on_gone)


def _disconnect_policy(
    services: Services, handle: RunHandle, policy: str
) -> Callable[[], None] | None:
    """What the client's disconnect does: cancel the run, or nothing (``continue``)."""
    if policy != "cancel":
        return None
    manager = services.manager
    run_id = handle.run_id

    def cancel() -> None:
        manager.cancel_local(run_id, "client_disconnected")

    return cancel


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
        return JSONResponse(queued)
    if isinstance(found, RunHandle):
        return JSONResponse(manager.handle_view(found))
    return JSONResponse(record_view(found))


@router.get(
    "/v1/runs/{run_id}/events",
    summary="Follow a run's events",
    responses={
        200: {"description": "text/event-stream", "content": {"text/event-stream": {}}},
        404: _PROBLEMS[404],
        401: _PROBLEMS[401],
        422: _PROBLEMS[422],
    },
)
async def run_events(
    run_id: str,
    principal: Principal,
    services: ServicesDep,
    after: Annotated[int | None, Query(ge=0, description="Replay events after this seq")] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=r"^\s*[0-9]{0,18}\s*$",
            description="The seq of the last event received (the SSE id)",
        ),
    ] = None,
) -> Response:
    """Replay the events after ``Last-Event-ID`` (or ``?after=N``), then follow them live
    until the terminal event."""
    _check_run_id(run_id)
    cursor = after or 0
    if last_event_id is not None and last_event_id.strip():
        try:
            cursor = int(last_event_id.strip())
        except ValueError:
            raise ProblemError(
                422, "validation_error", "Last-Event-ID must be the seq of an event (an integer)"
            ) from None
        if cursor < 0:
            raise ProblemError(422, "validation_error", "Last-Event-ID must not be negative")
    found = await services.manager.find(run_id, principal)
    if found is None:  # a run waiting in its session's queue is followed once it starts
        found = await services.manager.find_after_queue(run_id, principal)
    if found is None:
        raise _not_found(run_id)
    if not await services.bus.events.exists(run_id):
        raise ProblemError(
            404, "not_found", f"the events of run {run_id!r} are no longer kept (they expired)"
        )
    return EventStreamResponse(
        events=services.bus.events,
        run_id=run_id,
        after=cursor,
        headers={"X-Run-Id": run_id},
        ping=services.settings.sse_ping,
        send_timeout=services.settings.send_timeout,
        manager=services.manager,
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
