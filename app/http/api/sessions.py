"""Sessions: the caller's list, a summary, its title, the stored conversation, deletion."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.bus.wire import iso_ms
from app.http.api.errors import ProblemError
from app.http.api.parts import shown_message
from app.http.api.schemas import (
    SESSION_CURSOR_PATTERN,
    MessagesView,
    Problem,
    SessionId,
    SessionList,
    SessionPatch,
    SessionView,
)
from app.runs.branches import PARENT_KEY, parents, turns_of
from app.server.services import Services, ServicesDep
from app.storage import RunRecord, SessionCursor, SessionRecord, StoredMessage

__all__ = ["router"]

router = APIRouter(tags=["sessions"])

Principal = Annotated[str, Depends(principal_of)]

_PROBLEM = {"model": Problem, "content": {"application/problem+json": {}}}

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def encode_cursor(cursor: SessionCursor) -> str:
    """``<updated_at in microseconds since the epoch>.<session id>``: exact to the
    microsecond both backends keep, so the next page starts exactly after this session."""
    return f"{(cursor.updated_at - _EPOCH) // _MICROSECOND}.{cursor.session_id}"


def decode_cursor(text: str) -> SessionCursor:
    """The cursor ``encode_cursor`` made (``text`` already matched SESSION_CURSOR_PATTERN)."""
    micros, _, session_id = text.partition(".")
    return SessionCursor(_EPOCH + int(micros) * _MICROSECOND, session_id)


def _active_run(holder: str | None) -> str | None:
    # a session's lock is held by its active run, or for a moment by a deletion
    return holder if holder is not None and holder.startswith("run_") else None


def _session_view(session: SessionRecord, holder: str | None) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "created_at": iso_ms(session.created_at.timestamp()),
        "updated_at": iso_ms(session.updated_at.timestamp()),
        "message_count": session.message_count,
        "last_run_id": session.last_run_id,
        "active_run_id": _active_run(holder),
        "title": session.title,
        "stateless": session.stateless,
    }


def _iso(record: RunRecord, name: str) -> str | None:
    moment = getattr(record, name)
    return None if moment is None else iso_ms(moment.timestamp())


def _turn_run(record: RunRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "agent": record.agent,
        "status": record.status,
        "model": record.model,
        "usage": record.usage,
        "created_at": _iso(record, "created_at"),
        "finished_at": _iso(record, "finished_at"),
    }


async def _owned(services: Services, session_id: str, principal: str) -> SessionRecord:
    session = await services.store.get_session(session_id)
    if session is None or session.principal != principal:
        raise ProblemError(404, "not_found", f"no session {session_id!r}")
    return session


@router.get(
    "/v1/sessions",
    summary="The caller's sessions",
    response_model=SessionList,
    responses={422: _PROBLEM},
)
async def list_sessions(
    principal: Principal,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Sessions per page")] = 20,
    before: Annotated[
        str | None,
        Query(
            pattern=SESSION_CURSOR_PATTERN,
            description="The `next` of the previous page: the sessions after it",
        ),
    ] = None,
) -> Response:
    """The caller's sessions, most recently updated first, a page at a time."""
    cursor = None if before is None else decode_cursor(before)
    # one more than asked: whether it comes tells if there is a next page, so the last page
    # says so (next: null) instead of a client reading one more, empty, page
    found = await services.store.list_sessions(principal, limit + 1, cursor)
    page = found[:limit]
    # every lock in one round trip (one MGET with Redis), not one per session
    holders = await services.bus.locks.holders([session.id for session in page])
    return JSONResponse(
        {
            "sessions": [_session_view(s, h) for s, h in zip(page, holders, strict=True)],
            "next": encode_cursor(SessionCursor.after(page[-1])) if len(found) > limit else None,
        }
    )


@router.get(
    "/v1/sessions/{session_id}",
    summary="A session's summary",
    response_model=SessionView,
    responses={404: _PROBLEM},
)
async def get_session(
    session_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """The session, with the id of its active run (or null)."""
    session = await _owned(services, session_id, principal)
    return JSONResponse(_session_view(session, await services.bus.locks.holder(session_id)))


@router.patch(
    "/v1/sessions/{session_id}",
    summary="Rename a session",
    response_model=SessionView,
    responses={404: _PROBLEM, 422: _PROBLEM},
)
async def patch_session(
    session_id: SessionId, body: SessionPatch, principal: Principal, services: ServicesDep
) -> Response:
    """Set the session's title (by default its first input)."""
    await _owned(services, session_id, principal)
    session = await services.store.set_title(session_id, body.title)
    if session is None:  # deleted in between
        raise ProblemError(404, "not_found", f"no session {session_id!r}")
    return JSONResponse(_session_view(session, await services.bus.locks.holder(session_id)))


@router.get(
    "/v1/sessions/{session_id}/messages",
    summary="The stored conversation",
    response_model=MessagesView,
    responses={404: _PROBLEM},
)
async def get_messages(
    session_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """Every message of the session's turns, oldest first (a stopped turn's marked
    ``stopped``, the first of each turn naming the turn it continues), and the runs behind
    them."""
    await _owned(services, session_id, principal)
    stored = await services.store.list_messages(session_id)
    shown = {item.run_id for item in stored}
    runs = (
        [r for r in await services.store.list_runs(session_id, None) if r.run_id in shown]
        if shown
        else []
    )
    return JSONResponse(
        {
            "session_id": session_id,
            "messages": _shown_messages(stored),
            "runs": [_turn_run(r) for r in reversed(runs)],
        }
    )


def _shown_messages(stored: list[StoredMessage]) -> list[dict[str, Any]]:
    """The stored messages as listed, the first of each turn with ``parent_run``: the turn it
    continues, or None for a first turn (``app.runs.branches``), so a client reads the tree
    without knowing that a turn naming none continues the one stored before it."""
    turns = turns_of(stored)
    up = parents(turns)
    shown: list[dict[str, Any]] = []
    for turn in turns:
        for index, item in enumerate(turn.messages):
            message = {
                **shown_message(item.message),
                "position": item.position,
                "run_id": item.run_id,
                "created_at": iso_ms(item.created_at.timestamp()),
            }
            message.pop(PARENT_KEY, None)
            if index == 0:
                message[PARENT_KEY] = up[turn.run_id]
            shown.append(message)
    return shown


@router.delete(
    "/v1/sessions/{session_id}",
    summary="Delete a session",
    status_code=204,
    responses={404: _PROBLEM, 409: _PROBLEM},
)
async def delete_session(
    session_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """Delete the session, its messages and its runs; 409 while a run is active."""
    await _owned(services, session_id, principal)
    locks = services.bus.locks
    # hold the session's lock while deleting, so no run can start in between
    lease = await locks.acquire(
        session_id, f"delete_{secrets.token_hex(8)}", services.settings.lease_seconds
    )
    if lease is None:
        raise ProblemError(
            409,
            "session_busy",
            f"session {session_id!r} has an active run; cancel it or wait for it to end",
            extra={"active_run_id": await locks.holder(session_id)},
        )
    try:
        await services.store.delete_session(session_id)
    finally:
        await locks.release(lease)
    return Response(status_code=204)
