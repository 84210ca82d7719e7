"""Schedules: runs started on a cron timing or at one time, owned by the caller."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.errors import NotFound, Unavailable
from app.http.api.schedule_schemas import (
    ScheduleCreate,
    ScheduleList,
    SchedulePatch,
    ScheduleView,
)
from app.http.api.schemas import Problem
from app.schedules import Schedules, ScheduleSpec
from app.server.services import Services, ServicesDep
from app.storage.schedules import FiringRecord, ScheduleRecord

__all__ = ["router", "schedule_view"]

router = APIRouter(tags=["schedules"])

Principal = Annotated[str, Depends(principal_of)]

_PROBLEM = {"model": Problem, "content": {"application/problem+json": {}}}
_SCHEDULE_ID: Final = re.compile(r"^sch_[0-9a-f]{32}$")
_FIRINGS_SHOWN: Final = 20


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def _firing_view(firing: FiringRecord) -> dict[str, Any]:
    return {
        "due_at": _iso(firing.due_at),
        "status": firing.status,
        "run_id": firing.run_id,
        "attempts": firing.attempts,
        "detail": firing.detail,
        "missed": firing.missed,
        "updated_at": _iso(firing.updated_at),
    }


def schedule_view(
    record: ScheduleRecord, firings: list[FiringRecord] | None = None
) -> dict[str, Any]:
    """The JSON of a schedule (with its latest firings, when given)."""
    end_after: int | str | None = (
        record.end_count if record.end_count is not None else _iso(record.end_at)
    )
    view: dict[str, Any] = {
        "schedule_id": record.id,
        "agent": record.agent,
        "input": record.input,
        "cron": record.cron,
        "at": _iso(record.at),
        "timezone": record.timezone,
        "session_id": record.session_id,
        "end_after": end_after,
        "misfire": record.misfire,
        "paused": record.paused,
        "next_due_at": _iso(record.next_due_at),
        "fired_count": record.fired_count,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
    }
    if firings is not None:
        view["firings"] = [_firing_view(firing) for firing in firings]
    return view


def _schedules(services: Services) -> Schedules:
    schedules = services.schedules
    if schedules is None:  # pragma: no cover - built with the services
        raise Unavailable("schedules are not available yet", retry_after=1)
    return schedules


def _check_id(schedule_id: str) -> None:
    if not _SCHEDULE_ID.match(schedule_id):
        raise NotFound(f"no schedule {schedule_id!r}")


@router.post(
    "/v1/schedules",
    summary="Create a schedule",
    status_code=201,
    response_model=ScheduleView,
    responses={404: _PROBLEM, 422: _PROBLEM},
)
async def create_schedule(
    body: ScheduleCreate, principal: Principal, services: ServicesDep
) -> Response:
    """Schedule runs of an agent: on a cron timing, or once at ``at``."""
    spec = ScheduleSpec(
        agent=body.agent,
        input=body.input,
        cron=body.cron,
        at=body.at,
        timezone=body.timezone,
        session_id=body.session_id,
        end_after=body.end_after,
        misfire=body.misfire,
        paused=body.paused,
    )
    record = await _schedules(services).create(principal, spec)
    return JSONResponse(
        schedule_view(record, []),
        status_code=201,
        headers={"Location": f"/v1/schedules/{record.id}"},
    )


@router.get(
    "/v1/schedules",
    summary="The caller's schedules",
    response_model=ScheduleList,
    responses={422: _PROBLEM},
)
async def list_schedules(
    principal: Principal,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Schedules at most")] = 100,
) -> Response:
    """The caller's schedules, newest first."""
    found = await _schedules(services).list_for(principal, limit)
    return JSONResponse({"schedules": [schedule_view(record) for record in found]})


@router.get(
    "/v1/schedules/{schedule_id}",
    summary="A schedule and its latest firings",
    response_model=ScheduleView,
    responses={404: _PROBLEM},
)
async def get_schedule(schedule_id: str, principal: Principal, services: ServicesDep) -> Response:
    """The schedule, with its latest firings (due time, status, run id, attempts)."""
    _check_id(schedule_id)
    schedules = _schedules(services)
    record = await schedules.get(principal, schedule_id)
    firings = await schedules.firings(principal, schedule_id, _FIRINGS_SHOWN)
    return JSONResponse(schedule_view(record, firings))


@router.patch(
    "/v1/schedules/{schedule_id}",
    summary="Change a schedule",
    response_model=ScheduleView,
    responses={404: _PROBLEM, 422: _PROBLEM},
)
async def patch_schedule(
    schedule_id: str, body: SchedulePatch, principal: Principal, services: ServicesDep
) -> Response:
    """Change the fields given; a new timing or a resume counts from now."""
    _check_id(schedule_id)
    changes = body.model_dump(exclude_unset=True)
    record = await _schedules(services).update(principal, schedule_id, changes)
    return JSONResponse(schedule_view(record))


@router.delete(
    "/v1/schedules/{schedule_id}",
    summary="Delete a schedule",
    status_code=204,
    responses={404: _PROBLEM},
)
async def delete_schedule(
    schedule_id: str, principal: Principal, services: ServicesDep
) -> Response:
    """Delete the schedule and its firings; runs it started go on."""
    _check_id(schedule_id)
    await _schedules(services).delete(principal, schedule_id)
    return Response(status_code=204)
