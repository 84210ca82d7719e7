"""``GET /v1/usage``: the caller's token usage, summed by agent, principal or UTC day."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, BeforeValidator, Field
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.http.api.schemas import Problem
from app.server.services import ServicesDep
from app.storage import UsageTotal

__all__ = ["router"]

router = APIRouter(tags=["usage"])

Principal = Annotated[str, Depends(principal_of)]

_PROBLEM = {"model": Problem, "content": {"application/problem+json": {}}}
_ISO_START = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_only(value: object) -> object:
    # pydantic also reads a number as Unix time; the schema (and the docs) say ISO 8601
    if isinstance(value, str) and not _ISO_START.match(value):
        raise ValueError("expected an ISO 8601 date or time, e.g. 2026-12-01 or 2026-12-01T12:00Z")
    return value


IsoMoment = Annotated[datetime, BeforeValidator(_iso_only)]


class UsageRow(BaseModel):
    """The tokens of one group's finished runs (``agent``, ``principal`` or ``day`` names it)."""

    agent: str | None = None
    principal: str | None = None
    day: str | None = Field(default=None, description="UTC date, YYYY-MM-DD")
    input_tokens: int
    output_tokens: int
    total_tokens: int
    runs: int
    cached_input_tokens: int | None = Field(
        default=None,
        description="Of input_tokens, those read from a prompt cache (only where reported)",
    )
    cache_write_tokens: int | None = Field(
        default=None,
        description="Of input_tokens, those written to a prompt cache (only where reported)",
    )
    reasoning_tokens: int | None = Field(
        default=None,
        description="Of output_tokens, those spent reasoning (only where reported)",
    )


class UsageReport(BaseModel):
    """``GET /v1/usage``."""

    principal: str
    group_by: Literal["agent", "principal", "day"]
    from_: str = Field(alias="from")
    to: str
    usage: list[UsageRow]
    total: UsageRow


def _utc(moment: datetime) -> datetime:
    # a date or a time without an offset is UTC, the budgets' window
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # an offset that moves year 1 or 9999 out of range: the edge
        edge = datetime.max if moment.year > 1 else datetime.min
        return edge.replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    # as iso_ms writes them (milliseconds, Z), for every year datetime has
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_DETAILS = ("cached_input_tokens", "cache_write_tokens", "reasoning_tokens")


def _row(name: str | None, key: str | None, totals: Sequence[UsageTotal]) -> dict[str, Any]:
    """One row of the report: the sums of ``totals`` (one group's, or every group's for the
    total); a cache or reasoning count only where some run reported it."""
    tokens_in = sum(t.input_tokens for t in totals)
    tokens_out = sum(t.output_tokens for t in totals)
    row: dict[str, Any] = {name: key} if name is not None else {}
    row.update(
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        total_tokens=tokens_in + tokens_out,
        runs=sum(t.runs for t in totals),
    )
    for detail in _DETAILS:
        reported = [value for t in totals if (value := getattr(t, detail)) is not None]
        if reported:
            row[detail] = sum(reported)
    return row


@router.get(
    "/v1/usage",
    summary="The caller's token usage",
    response_model=UsageReport,
    responses={422: _PROBLEM},
)
async def usage(
    principal: Principal,
    services: ServicesDep,
    start: Annotated[
        IsoMoment | None,
        Query(
            alias="from",
            description="Start (included), an ISO date or time (UTC without an offset); "
            "default: today, 00:00 UTC",
        ),
    ] = None,
    end: Annotated[
        IsoMoment | None,
        Query(alias="to", description="End (excluded), an ISO date or time; default: now"),
    ] = None,
    group_by: Annotated[
        Literal["agent", "principal", "day"], Query(description="What the rows sum by")
    ] = "agent",
) -> Response:
    """The tokens of the caller's runs that finished in ``[from, to)``, by agent, principal
    (the caller's one row) or UTC day; read from the store's usage ledger, which keeps a
    run's usage after its session is deleted. ``cached_input_tokens``, ``cache_write_tokens``
    (parts of ``input_tokens``) and ``reasoning_tokens`` (part of ``output_tokens``) appear
    where the runs' providers reported them."""
    now = datetime.now(UTC)
    since = (
        _utc(start) if start is not None else now.replace(hour=0, minute=0, second=0, microsecond=0)
    )
    until = _utc(end) if end is not None else now
    # an empty window (``to`` not after ``from``) has no usage: no query
    totals = (
        await services.store.usage_totals(
            start=since, end=until, group_by=group_by, principal=principal
        )
        if until > since
        else []
    )
    rows = [_row(group_by, t.key, [t]) for t in totals]
    total = _row(None, None, totals)
    return JSONResponse(
        {
            "principal": principal,
            "group_by": group_by,
            "from": _iso(since),
            "to": _iso(until),
            "usage": rows,
            "total": total,
        }
    )
