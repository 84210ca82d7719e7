"""Run checkpoints in PostgreSQL (see ``app.storage.checkpoints`` for what they are).

Each fenced write locks the run's row (``SELECT ... FOR UPDATE``) in the transaction that
writes, so the fence it compares cannot change before the write lands.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

from app.storage.base import (
    BackgroundOperations,
    StaleFence,
    encode_json,
    finish_on_cancel,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.rows import POSTGRES, checkpoint_record

__all__ = ["CHECKPOINTS_MIGRATION", "PostgresCheckpoints", "drop_checkpoint", "write_checkpoint"]

# The schema of run checkpoints (migration 9 in the project's numbering).
CHECKPOINTS_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS run_checkpoints (
        run_id text PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
        session_id text NOT NULL,
        step integer NOT NULL,
        event_seq bigint NOT NULL,
        data jsonb NOT NULL,
        resumes integer NOT NULL DEFAULT 0,
        handover text,
        fence bigint NOT NULL DEFAULT 0,
        updated_at timestamptz NOT NULL
    )""",
)

_COLUMNS: Final = "run_id, session_id, step, event_seq, data, resumes, handover, fence, updated_at"


class PostgresCheckpoints(BackgroundOperations):
    """The checkpoint operations of ``PostgresStore`` (which provides ``_connection``)."""

    def _connection(  # pragma: no cover - overridden by PostgresStore
        self,
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def _fenced(self, run_id: str, fence: int, what: str) -> AsyncIterator[Any]:
        """A transaction holding the run's row lock, once ``fence`` is found current."""
        async with self._connection() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT r.fence AS run_fence, c.fence AS checkpoint_fence FROM runs r"
                " LEFT JOIN run_checkpoints c ON c.run_id = r.run_id"
                " WHERE r.run_id = $1 FOR UPDATE OF r",
                run_id,
            )
            stored = 0 if row is None else max(row["run_fence"], row["checkpoint_fence"] or 0)
            if stored > fence:
                raise StaleFence(f"{what} of run {run_id!r}", fence, stored)
            yield conn

    @finish_on_cancel
    async def save_checkpoint(self, record: CheckpointRecord, *, fence: int) -> None:
        """Store the run's checkpoint in place of the last; see ``SQLiteCheckpoints``."""
        async with self._fenced(record.run_id, fence, "checkpoint") as conn:
            await write_checkpoint(conn, record, fence)

    @finish_on_cancel
    async def get_checkpoint(self, run_id: str) -> CheckpointRecord | None:
        """The run's last checkpoint, or None."""
        async with self._connection() as conn:
            row = await conn.fetchrow(
                f"SELECT {_COLUMNS} FROM run_checkpoints WHERE run_id = $1", run_id
            )
        return None if row is None else checkpoint_record(row, POSTGRES)

    @finish_on_cancel
    async def take_over_checkpoint(self, run_id: str, *, fence: int) -> CheckpointRecord | None:
        """Count one more resume and make ``fence`` the checkpoint's token; see
        ``SQLiteCheckpoints``."""
        async with self._fenced(run_id, fence, "checkpoint") as conn:
            row = await conn.fetchrow(
                "UPDATE run_checkpoints SET resumes = resumes + 1, fence = $2,"
                f" updated_at = now() WHERE run_id = $1 RETURNING {_COLUMNS}",
                run_id,
                fence,
            )
            if row is not None:  # the lost worker's own end, written late, is refused
                await conn.execute(
                    "UPDATE runs SET fence = GREATEST(fence, $2) WHERE run_id = $1", run_id, fence
                )
        return None if row is None else checkpoint_record(row, POSTGRES)

    @finish_on_cancel
    async def park_checkpoint(self, run_id: str, *, fence: int, reason: str) -> bool:
        """Mark the run's checkpoint as handed over; False if it has none."""
        async with self._fenced(run_id, fence, "checkpoint") as conn:
            status = await conn.execute(
                "UPDATE run_checkpoints SET handover = $2, updated_at = now() WHERE run_id = $1",
                run_id,
                reason,
            )
        return bool(status != "UPDATE 0")

    @finish_on_cancel
    async def delete_checkpoint(self, run_id: str, *, fence: int | None = None) -> None:
        """Forget the run's checkpoint; with ``fence``, only if not written with a newer one."""
        async with self._connection() as conn:
            await drop_checkpoint(conn, run_id, fence)


async def write_checkpoint(conn: Any, record: CheckpointRecord, fence: int) -> None:
    """Insert or replace the run's checkpoint, its fence already checked (``_fenced``) or
    the run new in the caller's transaction (a run's start writes its first)."""
    await conn.execute(
        f"INSERT INTO run_checkpoints ({_COLUMNS})"
        " VALUES ($1, $2, $3, $4, $5::jsonb, 0, NULL, $6, $7)"
        " ON CONFLICT (run_id) DO UPDATE SET step = excluded.step,"
        " event_seq = excluded.event_seq, data = excluded.data, handover = NULL,"
        " fence = excluded.fence, updated_at = excluded.updated_at"
        # the run's first (step 0, written beside its start) never replaces a later one
        " WHERE excluded.step > 0 OR run_checkpoints.step = 0",
        record.run_id,
        record.session_id,
        record.step,
        record.event_seq,
        encode_json(record.data),
        fence,
        record.updated_at,
    )


async def drop_checkpoint(conn: Any, run_id: str, fence: int | None) -> None:
    """``delete_checkpoint`` on ``conn`` (inside the caller's transaction, a run's end)."""
    await conn.execute(
        "DELETE FROM run_checkpoints WHERE run_id = $1"
        " AND ($2::bigint IS NULL OR fence <= $2::bigint)",
        run_id,
        fence,
    )
