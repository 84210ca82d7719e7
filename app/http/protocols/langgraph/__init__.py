"""A LangGraph-compatible Agent Server API at ``/langgraph``, for ``langgraph-sdk``,
``@langchain/langgraph-sdk`` (and its React ``useStream``) and the front ends built on them.

Assistants are the configured agents, threads are the caller's sessions, runs are our runs
(the same admission, ownership, durable runs and event logs as every other surface), and a
confirmation is an interrupt answered by ``command: {"resume": ...}``. Errors are
``{"detail": ...}`` with the HTTP status, as the SDKs read them. A route of LangGraph's API
not offered here answers 404 saying so. See docs/protocols.md for the route table.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from app.errors import NotFound
from app.http.protocols.langgraph import assistants, runs, threads

__all__ = ["LANGGRAPH_PREFIX", "router"]

LANGGRAPH_PREFIX = "/langgraph"

# described by LangGraph's own API reference, not in /openapi.json
router = APIRouter(prefix=LANGGRAPH_PREFIX, tags=["LangGraph"], include_in_schema=False)
router.include_router(assistants.router)
router.include_router(threads.router)
router.include_router(runs.router)


@router.get("/ok")
async def ok() -> Response:
    """Liveness, as LangGraph's server answers it."""
    return JSONResponse({"ok": True})


@router.get("/info")
async def info() -> Response:
    """What this server offers of LangGraph's API."""
    return JSONResponse(
        {
            "version": "agent-runtime",
            "flags": {"assistants": True, "crons": False, "langsmith": False},
        }
    )


@router.api_route(
    "/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def not_offered(path: str) -> Response:
    """Every other route of LangGraph's API (crons, store, assistant versions...)."""
    raise NotFound(f"/{path} of LangGraph's API is not offered by this server")
