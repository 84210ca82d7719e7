"""Threads: a thread is one of the caller's sessions, with a metadata object of its own."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from app.errors import Conflict, InvalidRequest, NotFound, SessionBusy
from app.http.api.schemas import is_session_id
from app.http.protocols.langgraph.keys import Principal
from app.http.protocols.langgraph.state import ThreadView, read_thread
from app.server.services import Services, ServicesDep
from app.storage import SessionRecord
from app.storage.base import SessionOwnedByOther
from app.storage.threads import ThreadQuery, check_metadata_filter

__all__ = ["owned_thread", "router"]

router = APIRouter()


def check_thread_id(thread_id: str) -> str:
    """``thread_id`` if it is a valid session id; InvalidRequest otherwise."""
    if not is_session_id(thread_id):
        raise InvalidRequest(
            f"thread_id {thread_id[:64]!r} is not a valid id: 1 to 128 of A-Z a-z 0-9 . _ : -"
        )
    return thread_id


async def owned_thread(services: Services, thread_id: str, principal: str) -> SessionRecord:
    """The caller's session ``thread_id``; NotFound for a missing or another's thread."""
    session = await services.store.get_session(thread_id) if is_session_id(thread_id) else None
    if session is None or session.principal != principal or session.stateless:
        raise NotFound(f"thread {thread_id!r} not found")
    return session


class ThreadCreate(BaseModel):
    model_config = ConfigDict(extra="allow")

    thread_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"


@router.post("/threads")
async def create(body: ThreadCreate, principal: Principal, services: ServicesDep) -> Response:
    """A new thread (a session owned by the caller)."""
    thread_id = check_thread_id(body.thread_id) if body.thread_id else str(uuid.uuid4())
    store = services.store
    existing = await store.get_session(thread_id)
    if existing is not None:
        if existing.principal != principal or body.if_exists == "raise":
            # another's thread is a conflict too: saying so reveals only that the id is taken
            raise Conflict(f"thread {thread_id!r} already exists", code="thread_exists")
        return JSONResponse((await read_thread(services, existing)).thread())
    try:
        session = await store.get_or_create_session(thread_id, principal)
    except SessionOwnedByOther:
        raise Conflict(f"thread {thread_id!r} already exists", code="thread_exists") from None
    if body.metadata:
        await store.set_thread_metadata(thread_id, body.metadata)
    return JSONResponse((await read_thread(services, session, body.metadata)).thread())


@router.get("/threads/{thread_id}")
async def get(thread_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The thread, with its state values and status."""
    session = await owned_thread(services, thread_id, principal)
    return JSONResponse((await read_thread(services, session)).thread())


class ThreadPatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] = Field(default_factory=dict)


@router.patch("/threads/{thread_id}")
async def patch(
    thread_id: str, body: ThreadPatch, principal: Principal, services: ServicesDep
) -> Response:
    """Merge ``metadata`` into the thread's."""
    session = await owned_thread(services, thread_id, principal)
    metadata = {**await services.store.thread_metadata(thread_id), **body.metadata}
    await services.store.set_thread_metadata(thread_id, metadata)
    return JSONResponse((await read_thread(services, session, metadata)).thread())


@router.delete("/threads/{thread_id}", status_code=204)
async def delete(thread_id: str, principal: Principal, services: ServicesDep) -> Response:
    """Delete the thread (its session and messages); 409 while a run is active."""
    await owned_thread(services, thread_id, principal)
    holder = await services.bus.locks.holder(thread_id)
    if holder is not None:
        raise SessionBusy(f"thread {thread_id!r} has an active run", code="session_busy")
    await services.store.delete_session(thread_id)
    return Response(status_code=204)


class ThreadSearch(BaseModel):
    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] = Field(default_factory=dict)
    ids: list[str] | None = Field(default=None, max_length=1000)
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    values: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=100_000)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at"] = "updated_at"
    sort_order: Literal["asc", "desc"] = "desc"


async def _search(services: Services, principal: str, body: ThreadSearch) -> list[ThreadView]:
    if body.values:
        raise InvalidRequest("searching threads by their values is not offered")
    try:
        metadata = check_metadata_filter(body.metadata)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    # a status is known only once a thread is read: filter after reading, a page at a time
    sort_by = body.sort_by if body.sort_by in ("created_at", "updated_at") else "updated_at"
    found: list[ThreadView] = []
    skipped = 0
    offset = 0 if body.status is not None else body.offset
    while len(found) < body.limit:
        query = ThreadQuery(
            principal=principal,
            metadata=metadata,
            session_ids=tuple(body.ids) if body.ids is not None else None,
            limit=body.limit if body.status is None else 100,
            offset=offset,
            sort_by=sort_by,
            descending=body.sort_order == "desc",
        )
        page = await services.store.search_threads(query)
        for session, meta in page:
            view = await read_thread(services, session, meta)
            if body.status is not None and view.status != body.status:
                continue
            if body.status is not None and skipped < body.offset:
                skipped += 1
                continue
            found.append(view)
            if len(found) == body.limit:
                break
        if len(page) < query.limit or body.status is None:
            break
        offset += len(page)
    if body.sort_by == "thread_id":
        found.sort(key=lambda v: v.thread_id, reverse=body.sort_order == "desc")
    elif body.sort_by == "status":
        found.sort(key=lambda v: v.status, reverse=body.sort_order == "desc")
    return found


@router.post("/threads/search")
async def search(body: ThreadSearch, principal: Principal, services: ServicesDep) -> Response:
    """The caller's threads matching ``metadata`` (each key equal), ``ids`` and ``status``."""
    return JSONResponse([view.thread() for view in await _search(services, principal, body)])


@router.post("/threads/count")
async def count(body: ThreadSearch, principal: Principal, services: ServicesDep) -> Response:
    """How many threads ``search`` finds (up to 1,000)."""
    body.limit, body.offset = 1000, 0
    return JSONResponse(len(await _search(services, principal, body)))


@router.get("/threads/{thread_id}/state")
async def state(thread_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The thread's current state (``ThreadState``)."""
    session = await owned_thread(services, thread_id, principal)
    return JSONResponse((await read_thread(services, session)).state())


@router.get("/threads/{thread_id}/state/{checkpoint_id}")
async def state_at(
    thread_id: str, checkpoint_id: str, principal: Principal, services: ServicesDep
) -> Response:
    """The thread's state at one of its checkpoints."""
    session = await owned_thread(services, thread_id, principal)
    for item in (await read_thread(services, session)).history():
        if item["checkpoint"]["checkpoint_id"] == checkpoint_id:
            return JSONResponse(item)
    raise NotFound(f"checkpoint {checkpoint_id!r} not found in thread {thread_id!r}")


class HistoryQuery(BaseModel):
    model_config = ConfigDict(extra="allow")

    limit: int = Field(default=10, ge=1, le=1000)
    before: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None


def _history(view: ThreadView, query: HistoryQuery) -> list[dict[str, Any]]:
    states = view.history()
    before = query.before
    before_id = before.get("checkpoint_id") if isinstance(before, dict) else before
    if before_id:
        ids = [s["checkpoint"]["checkpoint_id"] for s in states]
        states = states[ids.index(before_id) + 1 :] if before_id in ids else []
    if query.metadata:
        states = [
            s
            for s in states
            if all(s["metadata"].get(k) == v for k, v in (query.metadata or {}).items())
        ]
    return states[: query.limit]


@router.post("/threads/{thread_id}/history")
async def history(
    thread_id: str, body: HistoryQuery, principal: Principal, services: ServicesDep
) -> Response:
    """The thread's checkpoints, newest first: one per completed turn and per interrupt."""
    session = await owned_thread(services, thread_id, principal)
    return JSONResponse(_history(await read_thread(services, session), body))


@router.get("/threads/{thread_id}/history")
async def history_get(
    thread_id: str,
    principal: Principal,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    before: str | None = None,
) -> Response:
    """``POST /threads/{id}/history`` with query parameters."""
    session = await owned_thread(services, thread_id, principal)
    query = HistoryQuery(limit=limit, before=before)
    return JSONResponse(_history(await read_thread(services, session), query))


@router.post("/threads/{thread_id}/copy")
async def copy(thread_id: str, principal: Principal, services: ServicesDep) -> Response:
    """A new thread with this one's metadata and stored turns."""
    session = await owned_thread(services, thread_id, principal)
    store = services.store
    new_id = str(uuid.uuid4())
    copied = await store.get_or_create_session(new_id, principal)
    metadata = await store.thread_metadata(thread_id)
    if metadata:
        await store.set_thread_metadata(new_id, metadata)
    turn: list[dict[str, Any]] = []
    run_id: str | None = None
    for item in await store.list_messages(session.id):
        if run_id is not None and item.run_id != run_id and turn:
            await store.append_messages(new_id, run_id, turn)
            turn = []
        run_id = item.run_id
        turn.append(dict(item.message))
    if run_id is not None and turn:
        await store.append_messages(new_id, run_id, turn)
    copied = await store.get_session(new_id) or copied
    return JSONResponse((await read_thread(services, copied, metadata)).thread())
