"""Sessions: a summary, the stored conversation, deletion."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.api.errors import ProblemError
from app.api.schemas import MessagesView, Problem, SessionId, SessionView
from app.auth import principal_of
from app.services import Services, ServicesDep
from app.storage import SessionRecord
from app.wire import iso_ms

__all__ = ["router"]

router = APIRouter(tags=["sessions"])

Principal = Annotated[str, Depends(principal_of)]

_NOT_FOUND = {"model": Problem, "content": {"application/problem+json": {}}}


async def _owned(services: Services, session_id: str, principal: str) -> SessionRecord:
    session = await services.store.get_session(session_id)
    if session is None or session.principal != principal:
        raise ProblemError(404, "not_found", f"no session {session_id!r}")
    return session


@router.get(
    "/v1/sessions/{session_id}",
    summary="A session's summary",
    response_model=SessionView,
    responses={404: _NOT_FOUND},
)
async def get_session(
    session_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """The session, with the id of its active run (or null)."""
    session = await _owned(services, session_id, principal)
    active = await services.bus.locks.holder(session_id)
    if active is not None and not active.startswith("run_"):
        active = None  # held by a deletion, not a run
    return JSONResponse(
        {
            "session_id": session.id,
            "created_at": iso_ms(session.created_at.timestamp()),
            "updated_at": iso_ms(session.updated_at.timestamp()),
            "message_count": session.message_count,
            "last_run_id": session.last_run_id,
            "active_run_id": active,
        }
    )


@router.get(
    "/v1/sessions/{session_id}/messages",
    summary="The stored conversation",
    response_model=MessagesView,
    responses={404: _NOT_FOUND},
)
async def get_messages(
    session_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """Every message of the session's completed runs, oldest first."""
    await _owned(services, session_id, principal)
    stored = await services.store.list_messages(session_id)
    messages: list[dict[str, Any]] = [
        {
            **item.message,
            "position": item.position,
            "run_id": item.run_id,
            "created_at": iso_ms(item.created_at.timestamp()),
        }
        for item in stored
    ]
    return JSONResponse({"session_id": session_id, "messages": messages})


@router.delete(
    "/v1/sessions/{session_id}",
    summary="Delete a session",
    status_code=204,
    responses={404: _NOT_FOUND, 409: _NOT_FOUND},
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
