"""Run checkpoints in SQLite (see ``app.storage.checkpoints`` for what they are).

Each write is one transaction of the store's (``_write``): the fence is read and compared in
the same transaction that writes, under SQLite's write lock, so no write with an older token
lands after one with a newer token.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from app.storage.base import (
    BackgroundOperations,
    StaleFence,
    encode_json,
    utcnow,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.rows import SQLITE, checkpoint_record
from app.storage.sqlite.timestamps import ts

__all__ = [
    "CHECKPOINTS_MIGRATION",
    "SHORT_CHECKPOINT",
    "SQLiteCheckpoints",
    "drop_checkpoint",
    "insert_checkpoint",
]

# The schema of run checkpoints (migration 9 in the project's numbering).
CHECKPOINTS_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS run_checkpoints (
        run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
        session_id TEXT NOT NULL,
        step INTEGER NOT NULL,
        event_seq INTEGER NOT NULL,
        data TEXT NOT NULL,
        resumes INTEGER NOT NULL DEFAULT 0,
        handover TEXT,
        fence INTEGER NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL
    )""",
)

SHORT_CHECKPOINT: Final = 256 * 1024
"""Characters of a checkpoint's data at most for it to be written on the loop's connection."""

_COLUMNS: Final = "run_id, session_id, step, event_seq, data, resumes, handover, fence, updated_at"


class SQLiteCheckpoints(BackgroundOperations):
    """The checkpoint operations of ``SQLiteStore`` (which provides ``_read`` and ``_write``)."""

    async def _read(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _write(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _quick_write(self, function: Any, *args: Any) -> Any:  # pragma: no cover
        raise NotImplementedError

    async def save_checkpoint(self, record: CheckpointRecord, *, fence: int) -> None:
        """Store the run's checkpoint in place of the last; ``StaleFence`` if the run or its
        checkpoint was written with a newer token."""
        # a run saves one after each model response, on its way: on the loop's connection
        # when it is small enough to write there (app.storage.sqlite.loop_connection)
        data = encode_json(record.data)
        write = self._quick_write if len(data) <= SHORT_CHECKPOINT else self._write
        await write(_save, record, data, fence)

    async def get_checkpoint(self, run_id: str) -> CheckpointRecord | None:
        """The run's last checkpoint, or None."""
        found: CheckpointRecord | None = await self._read(_get, run_id)
        return found

    async def take_over_checkpoint(self, run_id: str, *, fence: int) -> CheckpointRecord | None:
        """Count one more resume of the run and make ``fence`` its checkpoint's token (older
        writers are refused from now on); the checkpoint as it is now, None if it has none.
        ``StaleFence`` if it was written with a newer token."""
        found: CheckpointRecord | None = await self._write(_take_over, run_id, fence)
        return found

    async def park_checkpoint(self, run_id: str, *, fence: int, reason: str) -> bool:
        """Mark the run's checkpoint as handed over (``reason``); False if it has none."""
        parked: bool = await self._write(_park, run_id, fence, reason)
        return parked

    async def delete_checkpoint(self, run_id: str, *, fence: int | None = None) -> None:
        """Forget the run's checkpoint (its run ended); with ``fence``, only if not written
        with a newer token."""
        await self._write(drop_checkpoint, run_id, fence)


def _stored_fence(db: sqlite3.Connection, run_id: str) -> int:
    row = db.execute(
        "SELECT MAX(COALESCE((SELECT fence FROM runs WHERE run_id = ?), 0),"
        " COALESCE((SELECT fence FROM run_checkpoints WHERE run_id = ?), 0))",
        (run_id, run_id),
    ).fetchone()
    return int(row[0])


def _save(db: sqlite3.Connection, record: CheckpointRecord, data: str, fence: int) -> None:
    stored = _stored_fence(db, record.run_id)
    if stored > fence:
        raise StaleFence(f"checkpoint of run {record.run_id!r}", fence, stored)
    insert_checkpoint(db, record, fence, data)


def insert_checkpoint(
    db: sqlite3.Connection, record: CheckpointRecord, fence: int, data: str | None = None
) -> None:
    """The checkpoint's row (``data``: its data encoded already), its fence checked by the
    caller (or the run new in the caller's transaction, so that no token can be newer)."""
    db.execute(
        f"INSERT INTO run_checkpoints ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, 0, NULL, ?, ?)"
        " ON CONFLICT (run_id) DO UPDATE SET step = excluded.step,"
        " event_seq = excluded.event_seq, data = excluded.data, handover = NULL,"
        " fence = excluded.fence, updated_at = excluded.updated_at"
        # the run's first (step 0, written beside its start) never replaces a later one
        " WHERE excluded.step > 0 OR run_checkpoints.step = 0",
        (
            record.run_id,
            record.session_id,
            record.step,
            record.event_seq,
            encode_json(record.data) if data is None else data,
            fence,
            ts(record.updated_at),
        ),
    )


def _get(db: sqlite3.Connection, run_id: str) -> CheckpointRecord | None:
    row = db.execute(
        f"SELECT {_COLUMNS} FROM run_checkpoints WHERE run_id = ?", (run_id,)
    ).fetchone()
    return None if row is None else checkpoint_record(row, SQLITE)


def _take_over(db: sqlite3.Connection, run_id: str, fence: int) -> CheckpointRecord | None:
    stored = _stored_fence(db, run_id)
    if stored > fence:
        raise StaleFence(f"checkpoint of run {run_id!r}", fence, stored)
    found = _get(db, run_id)
    if found is None:
        return None
    db.execute(
        "UPDATE run_checkpoints SET resumes = resumes + 1, fence = ?, updated_at = ?"
        " WHERE run_id = ?",
        (fence, ts(utcnow()), run_id),
    )
    # the run's record too: the lost worker's own end, written late, is refused
    db.execute("UPDATE runs SET fence = MAX(fence, ?) WHERE run_id = ?", (fence, run_id))
    return _get(db, run_id)


def _park(db: sqlite3.Connection, run_id: str, fence: int, reason: str) -> bool:
    stored = _stored_fence(db, run_id)
    if stored > fence:
        raise StaleFence(f"checkpoint of run {run_id!r}", fence, stored)
    cursor = db.execute(
        "UPDATE run_checkpoints SET handover = ?, updated_at = ? WHERE run_id = ?",
        (reason, ts(utcnow()), run_id),
    )
    return cursor.rowcount > 0


def drop_checkpoint(db: sqlite3.Connection, run_id: str, fence: int | None) -> None:
    """``delete_checkpoint`` inside the caller's transaction (a run's end drops it)."""
    db.execute(
        "DELETE FROM run_checkpoints WHERE run_id = ? AND (? IS NULL OR fence <= ?)",
        (run_id, fence, fence),
    )
