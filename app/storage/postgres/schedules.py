"""Schedules and their firings in PostgreSQL (see ``app.storage.schedules`` for the claims).

A claim is one conditional ``UPDATE`` (row-locked by PostgreSQL: of two concurrent ones with
the same expectation, the second re-reads the row after the first commits and matches
nothing); a takeover is ``UPDATE ... WHERE ... FOR UPDATE SKIP LOCKED ... RETURNING``, so two
workers never take over the same firing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final

from app.storage.base import BackgroundOperations, encode_json, finish_on_cancel
from app.storage.rows import POSTGRES, firing_record, schedule_record
from app.storage.schedules import (
    FiringFence,
    FiringLost,
    FiringRecord,
    FiringStatus,
    ScheduleRecord,
)

__all__ = ["SCHEDULES_MIGRATION", "PostgresSchedules"]

# The schema of schedules (migration 7 in the project's numbering).
SCHEDULES_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS schedules (
        id text PRIMARY KEY,
        principal text NOT NULL,
        agent text NOT NULL,
        input text NOT NULL,
        cron text,
        at timestamptz,
        timezone text NOT NULL,
        session_id text,
        end_count integer,
        end_at timestamptz,
        misfire text NOT NULL,
        paused boolean NOT NULL DEFAULT false,
        next_due_at timestamptz,
        fired_count integer NOT NULL DEFAULT 0,
        metadata jsonb NOT NULL,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS schedules_by_principal ON schedules (principal, created_at, id)",
    """CREATE INDEX IF NOT EXISTS schedules_due ON schedules (next_due_at)
        WHERE next_due_at IS NOT NULL AND NOT paused""",
    """CREATE TABLE IF NOT EXISTS schedule_firings (
        schedule_id text NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
        due_at timestamptz NOT NULL,
        status text NOT NULL,
        token bigint NOT NULL,
        lease_until timestamptz NOT NULL,
        run_id text,
        attempts integer NOT NULL DEFAULT 0,
        detail text,
        missed integer NOT NULL DEFAULT 0,
        created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL,
        PRIMARY KEY (schedule_id, due_at)
    )""",
    """CREATE INDEX IF NOT EXISTS schedule_firings_open ON schedule_firings (lease_until)
        WHERE status IN ('claimed', 'retrying')""",
)

_SCHEDULE_COLUMNS: Final = (
    "id, principal, agent, input, cron, at, timezone, session_id, end_count, end_at, misfire,"
    " paused, next_due_at, fired_count, metadata, created_at, updated_at"
)
_FIRING_COLUMNS: Final = (
    "schedule_id, due_at, status, token, lease_until, run_id, attempts, detail, missed,"
    " created_at, updated_at"
)


class PostgresSchedules(BackgroundOperations):
    """The schedule operations of ``PostgresStore`` (which provides ``_connection``)."""

    def _connection(  # pragma: no cover - overridden by PostgresStore
        self,
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        async with self._connection() as conn:
            yield conn

    @finish_on_cancel
    async def create_schedule(self, record: ScheduleRecord) -> None:
        """Store a new schedule."""
        async with self._conn() as conn:
            await conn.execute(
                f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES"
                " ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
                record.id,
                record.principal,
                record.agent,
                record.input,
                record.cron,
                record.at,
                record.timezone,
                record.session_id,
                record.end_count,
                record.end_at,
                record.misfire,
                record.paused,
                record.next_due_at,
                record.fired_count,
                encode_json(record.metadata),
                record.created_at,
                record.updated_at,
            )

    @finish_on_cancel
    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None. The caller checks ``principal``."""
        async with self._conn() as conn:
            row = await conn.fetchrow(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE id = $1", schedule_id
            )
        return None if row is None else schedule_record(row, POSTGRES)

    @finish_on_cancel
    async def list_schedules(self, principal: str, limit: int = 100) -> list[ScheduleRecord]:
        """The principal's schedules, newest first."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        async with self._conn() as conn:
            rows = await conn.fetch(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE principal = $1"
                " ORDER BY created_at DESC, id DESC LIMIT $2",
                principal,
                limit,
            )
        return [schedule_record(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def update_schedule(self, record: ScheduleRecord) -> bool:
        """Write a schedule's settings and next due time (not its count); False if gone."""
        async with self._conn() as conn:
            status: str = await conn.execute(
                "UPDATE schedules SET input = $2, cron = $3, at = $4, timezone = $5,"
                " end_count = $6, end_at = $7, misfire = $8, paused = $9, next_due_at = $10,"
                " metadata = $11, updated_at = $12 WHERE id = $1",
                record.id,
                record.input,
                record.cron,
                record.at,
                record.timezone,
                record.end_count,
                record.end_at,
                record.misfire,
                record.paused,
                record.next_due_at,
                encode_json(record.metadata),
                record.updated_at,
            )
        return status == "UPDATE 1"

    @finish_on_cancel
    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule and its firings; False if it did not exist."""
        async with self._conn() as conn:
            status: str = await conn.execute("DELETE FROM schedules WHERE id = $1", schedule_id)
        return status != "DELETE 0"

    @finish_on_cancel
    async def due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Schedules not paused whose next due time is at or before ``now``, earliest first."""
        async with self._conn() as conn:
            rows = await conn.fetch(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE next_due_at IS NOT NULL"
                " AND NOT paused AND next_due_at <= $1 ORDER BY next_due_at LIMIT $2",
                now,
                limit,
            )
        return [schedule_record(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def claim_due(
        self,
        schedule: ScheduleRecord,
        next_due_at: datetime | None,
        firing: FiringRecord,
    ) -> bool:
        """Move ``schedule`` on from the due time it was read with to ``next_due_at`` and
        record ``firing``, if no one did since (compare-and-set); True if this call won."""
        counted = 1 if firing.status != "skipped" else 0
        async with self._conn() as conn, conn.transaction():
            status: str = await conn.execute(
                "UPDATE schedules SET next_due_at = $2, fired_count = fired_count + $3,"
                " updated_at = now() WHERE id = $1 AND next_due_at = $4 AND fired_count = $5"
                " AND NOT paused",
                schedule.id,
                next_due_at,
                counted,
                schedule.next_due_at,
                schedule.fired_count,
            )
            if status != "UPDATE 1":
                return False
            await conn.execute(
                f"INSERT INTO schedule_firings ({_FIRING_COLUMNS})"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now())"
                " ON CONFLICT DO NOTHING",
                firing.schedule_id,
                firing.due_at,
                firing.status,
                firing.token,
                firing.lease_until,
                firing.run_id,
                firing.attempts,
                firing.detail,
                firing.missed,
            )
        return True

    @finish_on_cancel
    async def reclaim_firings(
        self, now: datetime, lease_until: datetime, limit: int
    ) -> list[FiringRecord]:
        """Take over open firings whose lease ended (token raised): the ones this call won."""
        async with self._conn() as conn:
            rows = await conn.fetch(
                "UPDATE schedule_firings AS f SET token = f.token + 1, lease_until = $2,"
                " status = 'claimed', updated_at = now() FROM (SELECT schedule_id, due_at"
                " FROM schedule_firings WHERE status IN ('claimed', 'retrying')"
                " AND lease_until <= $1 ORDER BY lease_until LIMIT $3 FOR UPDATE SKIP LOCKED)"
                " AS stale WHERE f.schedule_id = stale.schedule_id AND f.due_at = stale.due_at"
                " AND f.status IN ('claimed', 'retrying') AND f.lease_until <= $1"
                f" RETURNING {', '.join('f.' + c.strip() for c in _FIRING_COLUMNS.split(','))}",
                now,
                lease_until,
                limit,
            )
        return [firing_record(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def settle_firing(
        self,
        firing: FiringRecord,
        *,
        status: FiringStatus,
        run_id: str | None = None,
        detail: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """Record what came of a firing, if ``firing.token`` is still its current one."""
        async with self._conn() as conn:
            answer: str = await conn.execute(
                "UPDATE schedule_firings SET status = $4, run_id = COALESCE($5, run_id),"
                " detail = $6, lease_until = COALESCE($7, lease_until),"
                " attempts = attempts + 1, updated_at = now()"
                " WHERE schedule_id = $1 AND due_at = $2 AND token = $3 AND status = 'claimed'",
                firing.schedule_id,
                firing.due_at,
                firing.token,
                status,
                run_id,
                detail,
                lease_until,
            )
        return answer == "UPDATE 1"

    @finish_on_cancel
    async def list_firings(self, schedule_id: str, limit: int = 20) -> list[FiringRecord]:
        """The schedule's latest firings, newest due time first."""
        async with self._conn() as conn:
            rows = await conn.fetch(
                f"SELECT {_FIRING_COLUMNS} FROM schedule_firings WHERE schedule_id = $1"
                " ORDER BY due_at DESC LIMIT $2",
                schedule_id,
                limit,
            )
        return [firing_record(row, POSTGRES) for row in rows]


async def take_firing(conn: Any, fence: FiringFence, run_id: str) -> None:
    """Move the firing from ``claimed`` to ``started`` with ``run_id``, at ``fence.token``
    (inside the run's insert transaction); ``FiringLost`` when it is not held so."""
    answer: str = await conn.execute(
        "UPDATE schedule_firings SET status = 'started', run_id = $4, attempts = attempts + 1,"
        " updated_at = now()"
        " WHERE schedule_id = $1 AND due_at = $2 AND token = $3 AND status = 'claimed'",
        fence.schedule_id,
        fence.due_at,
        fence.token,
        run_id,
    )
    if answer != "UPDATE 1":
        raise FiringLost(fence)
