"""Health, readiness, metrics and (when enabled) debug introspection."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import sys
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.http.api.errors import problem_response
from app.server.services import ServicesDep
from app.telemetry.metrics import CONTENT_TYPE_LATEST

__all__ = ["debug_router", "router"]

router = APIRouter(tags=["operations"])
debug_router = APIRouter(tags=["debug"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    """Always 200 while the process serves HTTP."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Ready to take runs",
    responses={503: {"description": "Starting, draining, or a dependency is unreachable"}},
)
async def readyz(services: ServicesDep) -> Response:
    """200 once preflight is done and every required agent warmed up; 503 before that, while
    draining, and while the store or the bus does not answer (``app.server.readiness``). ``agents``
    reports each agent (``starting``, ``ready``, ``configured`` or ``unavailable`` with its
    ``reason``); ``readiness`` says what ready means: ``answered`` (the agents' models
    answered a warm-up call) or ``configured`` (``AGENT_WARMUP=0``: no call was made)."""
    agents = {"readiness": services.readiness, "agents": services.agents.states.to_dict()}
    if services.manager.draining:
        return problem_response(
            503,
            "draining",
            "the server is shutting down",
            headers={"Retry-After": "5"},
            extra=agents,
        )
    watch = services.dependencies
    if watch is not None and watch.problem:
        return problem_response(
            503,
            "unavailable",
            f"a dependency is {watch.problem}",
            headers={"Retry-After": "1"},
            extra=agents,
        )
    if not services.ready:
        return problem_response(
            503,
            "starting",
            f"the server is not ready: {services.readiness_problem}",
            headers={"Retry-After": "1"},
            extra=agents,
        )
    return JSONResponse({"status": "ready", **agents})


@router.get("/metrics", summary="Prometheus metrics of this worker")
async def metrics(services: ServicesDep) -> Response:
    """Prometheus text format. With several workers, each answers for itself."""
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@debug_router.get("/debug/state", summary="Counts of live runs and what they hold")
async def debug_state(
    services: ServicesDep,
    principal: Annotated[str, Depends(principal_of)],
    gc_scan: Annotated[bool, Query(alias="gc", description="Also count live futures")] = False,
) -> dict[str, Any]:
    """Runs, tasks, locks, subscribers, the agent's active runs and extension waits (only
    with AGENT_DEBUG_ENDPOINTS=1). ``loop_tasks`` counts every task of the worker's loop;
    with ``?gc=true`` the garbage is collected first and ``pending_futures`` counts the
    futures not done yet, tasks included, and ``allocated_blocks`` the Python objects' memory
    blocks in use (a scan of the heap: for leak checks, not polling)."""
    state = services.manager.debug_state()
    state["loop_tasks"] = len(asyncio.all_tasks())
    if gc_scan:
        gc.collect()
        state["pending_futures"] = sum(
            1 for item in gc.get_objects() if isinstance(item, asyncio.Future) and not item.done()
        )
        state["allocated_blocks"] = sys.getallocatedblocks()
        # hand the allocator's free pages back, so that the resident size read next is what
        # the process holds, not what glibc kept of a busier moment
        trim = _heap_trim()
        if trim is not None:
            trim(0)
    return state


@functools.cache
def _heap_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, where the process's C library is glibc."""
    if sys.platform != "linux":
        return None
    trim: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return trim
