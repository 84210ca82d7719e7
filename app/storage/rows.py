"""Rows into records: one mapper per record, shared by the SQLite and PostgreSQL stores.

A row is anything indexed by column name (``sqlite3.Row``, ``asyncpg.Record``, a dict). The
only difference between the dialects a mapper sees is how a timestamp arrives: ISO text in
SQLite, a ``datetime`` from PostgreSQL's ``timestamptz``. A `Dialect` names that decode step.
JSON arrives as text from both (SQLite's TEXT, and asyncpg hands ``jsonb`` over as text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol, cast

from app.storage.base import (
    RunRecord,
    SessionRecord,
    StoredMessage,
    UsageTotal,
    decode_json,
    decode_optional_json,
    decode_parts,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.schedules import FiringRecord, ScheduleRecord

__all__ = [
    "POSTGRES",
    "SQLITE",
    "USAGE_SUMS",
    "Dialect",
    "Row",
    "checkpoint_record",
    "firing_record",
    "run_record",
    "schedule_record",
    "session_record",
    "stored_message",
    "usage_total",
]


class Row(Protocol):
    """A row of a query's result, read by column name."""

    def __getitem__(self, column: str, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database hands a stored timestamp back."""

    name: str
    timestamp: Callable[[Any], datetime]

    def optional_timestamp(self, value: Any) -> datetime | None:
        return None if value is None else self.timestamp(value)


def _as_datetime(value: Any) -> datetime:
    # asyncpg already decodes timestamptz
    return cast(datetime, value)


SQLITE: Final = Dialect("sqlite", datetime.fromisoformat)
POSTGRES: Final = Dialect("postgres", _as_datetime)


def session_record(row: Row, dialect: Dialect) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        principal=row["principal"],
        created_at=dialect.timestamp(row["created_at"]),
        updated_at=dialect.timestamp(row["updated_at"]),
        message_count=row["message_count"],
        last_run_id=row["last_run_id"],
        title=row["title"],
        # SQLite stores a flag as 0 or 1
        stateless=bool(row["stateless"]),
    )


def stored_message(row: Row, dialect: Dialect) -> StoredMessage:
    return StoredMessage(
        session_id=row["session_id"],
        run_id=row["run_id"],
        position=row["position"],
        role=row["role"],
        message=decode_json(row["message"]),
        created_at=dialect.timestamp(row["created_at"]),
    )


def run_record(row: Row, dialect: Dialect) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        session_id=row["session_id"],
        principal=row["principal"],
        agent=row["agent"],
        status=row["status"],
        created_at=dialect.timestamp(row["created_at"]),
        started_at=dialect.optional_timestamp(row["started_at"]),
        finished_at=dialect.optional_timestamp(row["finished_at"]),
        input=row["input"],
        output=decode_optional_json(row["output"]),
        error=decode_optional_json(row["error"]),
        usage=decode_optional_json(row["usage"]),
        metadata=decode_json(row["metadata"]),
        model=row["model"],
        webhook_url=row["webhook_url"],
        input_parts=decode_parts(row["input_parts"]),
    )


def checkpoint_record(row: Row, dialect: Dialect) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=row["run_id"],
        session_id=row["session_id"],
        step=row["step"],
        event_seq=row["event_seq"],
        data=decode_json(row["data"]),
        resumes=row["resumes"],
        handover=row["handover"],
        fence=row["fence"],
        updated_at=dialect.timestamp(row["updated_at"]),
    )


def schedule_record(row: Row, dialect: Dialect) -> ScheduleRecord:
    return ScheduleRecord(
        id=row["id"],
        principal=row["principal"],
        agent=row["agent"],
        input=row["input"],
        cron=row["cron"],
        at=dialect.optional_timestamp(row["at"]),
        timezone=row["timezone"],
        session_id=row["session_id"],
        end_count=row["end_count"],
        end_at=dialect.optional_timestamp(row["end_at"]),
        misfire=row["misfire"],
        paused=bool(row["paused"]),
        next_due_at=dialect.optional_timestamp(row["next_due_at"]),
        fired_count=row["fired_count"],
        metadata=decode_json(row["metadata"]),
        created_at=dialect.timestamp(row["created_at"]),
        updated_at=dialect.timestamp(row["updated_at"]),
    )


def firing_record(row: Row, dialect: Dialect) -> FiringRecord:
    return FiringRecord(
        schedule_id=row["schedule_id"],
        due_at=dialect.timestamp(row["due_at"]),
        status=row["status"],
        token=row["token"],
        lease_until=dialect.timestamp(row["lease_until"]),
        run_id=row["run_id"],
        attempts=row["attempts"],
        detail=row["detail"],
        missed=row["missed"],
        created_at=dialect.timestamp(row["created_at"]),
        updated_at=dialect.timestamp(row["updated_at"]),
    )


USAGE_SUMS: Final = (
    "SUM(input_tokens), SUM(output_tokens), COUNT(*),"
    " SUM(cached_input_tokens), SUM(cache_write_tokens), SUM(reasoning_tokens)"
)
"""The sums of a group of usage ledger rows, after the group's key (``usage_total`` reads
them); a count no run of the group reported sums to NULL."""


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def usage_total(row: Any) -> UsageTotal:
    """A ``UsageTotal`` from a row of ``key, USAGE_SUMS`` (read by position)."""
    return UsageTotal(
        str(row[0]),
        int(row[1]),
        int(row[2]),
        int(row[3]),
        cached_input_tokens=_optional_int(row[4]),
        cache_write_tokens=_optional_int(row[5]),
        reasoning_tokens=_optional_int(row[6]),
    )
