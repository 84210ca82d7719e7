"""A principal's schedules: create, read, change and delete them, checked and owned.

Domain errors only (``app.errors``); ``app.http.api.schedules`` turns them into answers. Another
principal's schedule is, to the caller, one that does not exist (``NotFound``). A principal
has at most ``max_per_principal`` schedules (``too_many_schedules``): counted
and created under one lock in this worker, so creations through several workers at once can
pass the cap by at most one schedule per other worker.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from app.errors import InvalidRequest, NotFound
from app.schedules.timing import Timing, parse_timing, zone_names
from app.storage import Store
from app.storage.base import utcnow
from app.storage.schedules import FiringRecord, Misfire, ScheduleRecord

__all__ = [
    "DEFAULT_MAX_PER_PRINCIPAL",
    "DEFAULT_MIN_INTERVAL",
    "EndAfter",
    "ScheduleSpec",
    "Schedules",
    "first_due",
    "new_schedule_id",
]

EndAfter = int | datetime | None
"""A count of firings, or a moment after which nothing fires, or no end."""

_PATCHABLE: Final = frozenset({"input", "cron", "at", "timezone", "end_after", "misfire", "paused"})

DEFAULT_MAX_PER_PRINCIPAL: Final = 100
DEFAULT_MIN_INTERVAL: Final = 60.0


def new_schedule_id() -> str:
    """A schedule id: ``sch_`` and 128 random bits in hex."""
    return f"sch_{secrets.token_hex(16)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """What a caller asks a new schedule to be (already well-formed at the HTTP edge)."""

    agent: str
    input: str
    cron: str | None = None
    at: datetime | None = None
    timezone: str = "UTC"
    session_id: str | None = None
    end_after: EndAfter = None
    misfire: Misfire = "skip"
    paused: bool = False


def first_due(timing: Timing, now: datetime, end_count: int | None, fired: int) -> datetime | None:
    """The next due time of a schedule set (or changed, or resumed) at ``now``."""
    if end_count is not None and fired >= end_count:
        return None
    return timing.next_after(now)


def _split_end(end_after: EndAfter) -> tuple[int | None, datetime | None]:
    if isinstance(end_after, bool):  # a bool is an int to Python, never a count here
        raise InvalidRequest("'end_after' is a count of firings or a date", code="validation_error")
    if isinstance(end_after, int):
        if end_after < 1:
            raise InvalidRequest(
                "'end_after' as a count must be at least 1", code="validation_error"
            )
        return end_after, None
    return None, end_after


class Schedules:
    """The schedules of every principal, over one store: at most ``max_per_principal`` each,
    cron timings firing at most every ``min_interval`` seconds."""

    def __init__(
        self,
        store: Store,
        agents: Collection[str],
        *,
        clock: Callable[[], datetime] = utcnow,
        max_per_principal: int = DEFAULT_MAX_PER_PRINCIPAL,
        min_interval: float = DEFAULT_MIN_INTERVAL,
    ) -> None:
        self._store = store
        self._agents = agents
        self._clock = clock
        self._max_per_principal = max_per_principal
        self._min_interval = min_interval
        self._creating = asyncio.Lock()
        zone_names()  # read the tz database now, not inside a request

    def _parse(
        self,
        cron: str | None,
        at: datetime | None,
        timezone: str,
        end_at: datetime | None,
        now: datetime,
    ) -> Timing:
        return parse_timing(
            cron=cron,
            at=at,
            timezone=timezone,
            end_at=end_at,
            now=now,
            min_interval=self._min_interval,
        )

    def _check_agent(self, agent: str) -> None:
        if agent not in self._agents:
            known = ", ".join(sorted(self._agents))
            raise InvalidRequest(f"no agent {agent!r}; configured: {known}", code="unknown_agent")

    async def create(self, principal: str, spec: ScheduleSpec) -> ScheduleRecord:
        """Check and store a new schedule of ``principal``."""
        self._check_agent(spec.agent)
        now = self._clock()
        end_count, end_date = _split_end(spec.end_after)
        timing = self._parse(spec.cron, spec.at, spec.timezone, end_date, now)
        if spec.session_id is not None:
            session = await self._store.get_session(spec.session_id)
            if session is not None and session.principal != principal:
                raise NotFound(f"no session {spec.session_id!r}")
        record = ScheduleRecord(
            id=new_schedule_id(),
            principal=principal,
            agent=spec.agent,
            input=spec.input,
            cron=timing.cron,
            at=timing.at,
            timezone=spec.timezone,
            session_id=spec.session_id,
            end_count=end_count,
            end_at=timing.end_at,
            misfire=spec.misfire,
            paused=spec.paused,
            next_due_at=first_due(timing, now, end_count, 0),
            created_at=now,
            updated_at=now,
        )
        async with self._creating:
            held = await self._store.list_schedules(principal, self._max_per_principal)
            if len(held) >= self._max_per_principal:
                raise InvalidRequest(
                    f"{principal!r} already has {len(held)} schedules, the most this server "
                    "keeps for one caller (AGENT_SCHEDULER_MAX_PER_PRINCIPAL); delete one first",
                    code="too_many_schedules",
                )
            await self._store.create_schedule(record)
        return record

    async def get(self, principal: str, schedule_id: str) -> ScheduleRecord:
        """The caller's schedule; ``NotFound`` if there is none (or it is another's)."""
        record = await self._store.get_schedule(schedule_id)
        if record is None or record.principal != principal:
            raise NotFound(f"no schedule {schedule_id!r}")
        return record

    async def list_for(self, principal: str, limit: int = 100) -> list[ScheduleRecord]:
        """The caller's schedules, newest first."""
        return await self._store.list_schedules(principal, limit)

    async def firings(
        self, principal: str, schedule_id: str, limit: int = 20
    ) -> list[FiringRecord]:
        """The latest firings of the caller's schedule, newest first."""
        await self.get(principal, schedule_id)
        return await self._store.list_firings(schedule_id, limit)

    async def update(
        self, principal: str, schedule_id: str, changes: Mapping[str, Any]
    ) -> ScheduleRecord:
        """Change the caller's schedule. A new timing (``cron`` or ``at`` replaces the other)
        or a resume counts its next due time from now: what was missed meanwhile is not
        fired."""
        unknown = set(changes) - _PATCHABLE
        if unknown:
            raise InvalidRequest(
                f"cannot change {', '.join(sorted(unknown))}; delete the schedule and create "
                "another",
                code="validation_error",
            )
        record = await self.get(principal, schedule_id)
        now = self._clock()
        retimed = bool(changes.keys() & {"cron", "at", "timezone", "end_after"})
        paused = bool(changes.get("paused", record.paused))
        updated = replace(
            record,
            input=changes.get("input", record.input),
            misfire=changes.get("misfire", record.misfire),
            paused=paused,
            updated_at=now,
        )
        if retimed:
            cron, at = record.cron, record.at
            if "cron" in changes or "at" in changes:
                cron, at = changes.get("cron"), changes.get("at")
            kept: EndAfter = record.end_count if record.end_count is not None else record.end_at
            end_after: EndAfter = changes.get("end_after", kept)
            end_count, end_date = _split_end(end_after)
            timezone = changes.get("timezone", record.timezone)
            timing = self._parse(cron, at, timezone, end_date, now)
            updated = replace(
                updated,
                cron=timing.cron,
                at=timing.at,
                timezone=timezone,
                end_count=end_count,
                end_at=timing.end_at,
                next_due_at=first_due(timing, now, end_count, record.fired_count),
            )
        elif record.paused and not paused:
            timing = Timing(record.cron, record.at, record.timezone, record.end_at)
            updated = replace(
                updated,
                next_due_at=first_due(timing, now, record.end_count, record.fired_count),
            )
        if not await self._store.update_schedule(updated):
            raise NotFound(f"no schedule {schedule_id!r}")
        return updated

    async def delete(self, principal: str, schedule_id: str) -> None:
        """Delete the caller's schedule and its firings (runs already started go on)."""
        await self.get(principal, schedule_id)
        if not await self._store.delete_schedule(schedule_id):
            raise NotFound(f"no schedule {schedule_id!r}")
