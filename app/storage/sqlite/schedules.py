"""Schedules and their firings in SQLite (see ``app.storage.schedules`` for the claim rules).

Every claim is one ``BEGIN IMMEDIATE`` transaction: SQLite's write lock makes the
compare-and-set exclusive across the connections of every process sharing the file.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import Any, Final

from app.storage.base import BackgroundOperations, encode_json
from app.storage.rows import SQLITE, firing_record, schedule_record
from app.storage.schedules import (
    FiringFence,
    FiringLost,
    FiringRecord,
    FiringStatus,
    ScheduleRecord,
)
from app.storage.sqlite.timestamps import optional_ts, ts

__all__ = ["SCHEDULES_MIGRATION", "SQLiteSchedules"]

# The schema of schedules (migration 7 in the project's numbering).
SCHEDULES_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS schedules (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        agent TEXT NOT NULL,
        input TEXT NOT NULL,
        cron TEXT,
        at TEXT,
        timezone TEXT NOT NULL,
        session_id TEXT,
        end_count INTEGER,
        end_at TEXT,
        misfire TEXT NOT NULL,
        paused INTEGER NOT NULL DEFAULT 0,
        next_due_at TEXT,
        fired_count INTEGER NOT NULL DEFAULT 0,
        metadata TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS schedules_by_principal ON schedules (principal, created_at, id)",
    """CREATE INDEX IF NOT EXISTS schedules_due ON schedules (next_due_at)
        WHERE next_due_at IS NOT NULL AND paused = 0""",
    """CREATE TABLE IF NOT EXISTS schedule_firings (
        schedule_id TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
        due_at TEXT NOT NULL,
        status TEXT NOT NULL,
        token INTEGER NOT NULL,
        lease_until TEXT NOT NULL,
        run_id TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        detail TEXT,
        missed INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
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


def _schedule_values(record: ScheduleRecord) -> tuple[Any, ...]:
    return (
        record.id,
        record.principal,
        record.agent,
        record.input,
        record.cron,
        optional_ts(record.at),
        record.timezone,
        record.session_id,
        record.end_count,
        optional_ts(record.end_at),
        record.misfire,
        int(record.paused),
        optional_ts(record.next_due_at),
        record.fired_count,
        encode_json(record.metadata),
        ts(record.created_at),
        ts(record.updated_at),
    )


class SQLiteSchedules(BackgroundOperations):
    """The schedule operations of ``SQLiteStore`` (which provides ``_read`` and ``_write``)."""

    async def _read(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _write(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def create_schedule(self, record: ScheduleRecord) -> None:
        """Store a new schedule."""
        await self._write(_create_schedule, record)

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None. The caller checks ``principal``."""
        found: ScheduleRecord | None = await self._read(_get_schedule, schedule_id)
        return found

    async def list_schedules(self, principal: str, limit: int = 100) -> list[ScheduleRecord]:
        """The principal's schedules, newest first."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        found: list[ScheduleRecord] = await self._read(_list_schedules, principal, limit)
        return found

    async def update_schedule(self, record: ScheduleRecord) -> bool:
        """Write a schedule's settings and next due time (not its count); False if gone."""
        changed: bool = await self._write(_update_schedule, record)
        return changed

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule and its firings; False if it did not exist."""
        deleted: bool = await self._write(_delete_schedule, schedule_id)
        return deleted

    async def due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Schedules not paused whose next due time is at or before ``now``, earliest first."""
        found: list[ScheduleRecord] = await self._read(_due_schedules, ts(now), limit)
        return found

    async def claim_due(
        self,
        schedule: ScheduleRecord,
        next_due_at: datetime | None,
        firing: FiringRecord,
    ) -> bool:
        """Move ``schedule`` on from the due time it was read with to ``next_due_at`` and
        record ``firing``, if no one did since (compare-and-set); True if this call won."""
        won: bool = await self._write(_claim_due, schedule, next_due_at, firing)
        return won

    async def reclaim_firings(
        self, now: datetime, lease_until: datetime, limit: int
    ) -> list[FiringRecord]:
        """Take over open firings whose lease ended (token raised): the ones this call won."""
        found: list[FiringRecord] = await self._write(
            _reclaim_firings, ts(now), ts(lease_until), limit
        )
        return found

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
        settled: bool = await self._write(
            _settle_firing, firing, status, run_id, detail, optional_ts(lease_until)
        )
        return settled

    async def list_firings(self, schedule_id: str, limit: int = 20) -> list[FiringRecord]:
        """The schedule's latest firings, newest due time first."""
        found: list[FiringRecord] = await self._read(_list_firings, schedule_id, limit)
        return found


def _now() -> str:
    return ts(datetime.now(UTC))


def _create_schedule(db: sqlite3.Connection, record: ScheduleRecord) -> None:
    marks = ", ".join("?" * 17)
    db.execute(
        f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES ({marks})", _schedule_values(record)
    )


def _get_schedule(db: sqlite3.Connection, schedule_id: str) -> ScheduleRecord | None:
    row = db.execute(
        f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE id = ?", (schedule_id,)
    ).fetchone()
    return None if row is None else schedule_record(row, SQLITE)


def _list_schedules(db: sqlite3.Connection, principal: str, limit: int) -> list[ScheduleRecord]:
    rows = db.execute(
        f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE principal = ?"
        " ORDER BY created_at DESC, id DESC LIMIT ?",
        (principal, limit),
    ).fetchall()
    return [schedule_record(row, SQLITE) for row in rows]


def _update_schedule(db: sqlite3.Connection, record: ScheduleRecord) -> bool:
    return (
        db.execute(
            "UPDATE schedules SET input = ?, cron = ?, at = ?, timezone = ?, end_count = ?,"
            " end_at = ?, misfire = ?, paused = ?, next_due_at = ?, metadata = ?,"
            " updated_at = ? WHERE id = ?",
            (
                record.input,
                record.cron,
                optional_ts(record.at),
                record.timezone,
                record.end_count,
                optional_ts(record.end_at),
                record.misfire,
                int(record.paused),
                optional_ts(record.next_due_at),
                encode_json(record.metadata),
                ts(record.updated_at),
                record.id,
            ),
        ).rowcount
        == 1
    )


def _delete_schedule(db: sqlite3.Connection, schedule_id: str) -> bool:
    return db.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,)).rowcount > 0


def _due_schedules(db: sqlite3.Connection, now: str, limit: int) -> list[ScheduleRecord]:
    rows = db.execute(
        f"SELECT {_SCHEDULE_COLUMNS} FROM schedules"
        " WHERE next_due_at IS NOT NULL AND paused = 0 AND next_due_at <= ?"
        " ORDER BY next_due_at LIMIT ?",
        (now, limit),
    ).fetchall()
    return [schedule_record(row, SQLITE) for row in rows]


def _claim_due(
    db: sqlite3.Connection,
    schedule: ScheduleRecord,
    next_due_at: datetime | None,
    firing: FiringRecord,
) -> bool:
    assert schedule.next_due_at is not None
    counted = 1 if firing.status != "skipped" else 0
    now = _now()
    won = db.execute(
        "UPDATE schedules SET next_due_at = ?, fired_count = fired_count + ?, updated_at = ?"
        " WHERE id = ? AND next_due_at = ? AND fired_count = ? AND paused = 0",
        (
            optional_ts(next_due_at),
            counted,
            now,
            schedule.id,
            ts(schedule.next_due_at),
            schedule.fired_count,
        ),
    ).rowcount
    if won != 1:
        return False
    db.execute(
        f"INSERT OR IGNORE INTO schedule_firings ({_FIRING_COLUMNS})"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            firing.schedule_id,
            ts(firing.due_at),
            firing.status,
            firing.token,
            ts(firing.lease_until),
            firing.run_id,
            firing.attempts,
            firing.detail,
            firing.missed,
            now,
            now,
        ),
    )
    return True


def _reclaim_firings(
    db: sqlite3.Connection, now: str, lease_until: str, limit: int
) -> list[FiringRecord]:
    # inside the write transaction: what is read here is what the update changes
    rows = db.execute(
        f"SELECT {_FIRING_COLUMNS} FROM schedule_firings"
        " WHERE status IN ('claimed', 'retrying') AND lease_until <= ?"
        " ORDER BY lease_until LIMIT ?",
        (now, limit),
    ).fetchall()
    taken: list[FiringRecord] = []
    for row in rows:
        db.execute(
            "UPDATE schedule_firings SET token = token + 1, lease_until = ?, status = 'claimed',"
            " updated_at = ? WHERE schedule_id = ? AND due_at = ? AND token = ?",
            (lease_until, now, row["schedule_id"], row["due_at"], row["token"]),
        )
        again = db.execute(
            f"SELECT {_FIRING_COLUMNS} FROM schedule_firings WHERE schedule_id = ? AND due_at = ?",
            (row["schedule_id"], row["due_at"]),
        ).fetchone()
        taken.append(firing_record(again, SQLITE))
    return taken


def _settle_firing(
    db: sqlite3.Connection,
    firing: FiringRecord,
    status: str,
    run_id: str | None,
    detail: str | None,
    lease_until: str | None,
) -> bool:
    return (
        db.execute(
            "UPDATE schedule_firings SET status = ?, run_id = COALESCE(?, run_id), detail = ?,"
            " lease_until = COALESCE(?, lease_until), attempts = attempts + 1, updated_at = ?"
            " WHERE schedule_id = ? AND due_at = ? AND token = ? AND status = 'claimed'",
            (
                status,
                run_id,
                detail,
                lease_until,
                _now(),
                firing.schedule_id,
                ts(firing.due_at),
                firing.token,
            ),
        ).rowcount
        == 1
    )


def _list_firings(db: sqlite3.Connection, schedule_id: str, limit: int) -> list[FiringRecord]:
    rows = db.execute(
        f"SELECT {_FIRING_COLUMNS} FROM schedule_firings WHERE schedule_id = ?"
        " ORDER BY due_at DESC LIMIT ?",
        (schedule_id, limit),
    ).fetchall()
    return [firing_record(row, SQLITE) for row in rows]


def take_firing(db: sqlite3.Connection, fence: FiringFence, run_id: str) -> None:
    """Move the firing from ``claimed`` to ``started`` with ``run_id``, at ``fence.token``
    (inside the run's insert transaction); ``FiringLost`` when it is not held so."""
    moved = db.execute(
        "UPDATE schedule_firings SET status = 'started', run_id = ?, attempts = attempts + 1,"
        " updated_at = ? WHERE schedule_id = ? AND due_at = ? AND token = ? AND status = 'claimed'",
        (run_id, _now(), fence.schedule_id, ts(fence.due_at), fence.token),
    ).rowcount
    if moved != 1:
        raise FiringLost(fence)
