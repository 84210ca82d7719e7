"""The SQLite backend, on aiosqlite: one connection, WAL, JSON as TEXT.

aiosqlite runs every statement on the connection's own thread, in the order they were
queued, so the event loop never blocks on disk. Because all tasks share that one
connection, an `asyncio.Lock` gives each operation (and each transaction) the connection to
itself: otherwise one task's statements would land inside another task's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiosqlite

from app.storage.base import (
    TERMINAL_STATUSES,
    BackgroundOperations,
    RunAlreadyExists,
    RunNotFound,
    RunRecord,
    RunStatus,
    SessionNotFound,
    SessionOwnedByOther,
    SessionRecord,
    StorageError,
    StorageUnavailable,
    StoredMessage,
    decode_json,
    decode_optional_json,
    encode_json,
    encode_optional_json,
    finish_on_cancel,
    message_role,
    run_update_stamps,
    utcnow,
)

logger = logging.getLogger("app.storage")

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

# Each entry is one schema version; never edit a shipped entry, append a new one.
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            message_count INTEGER NOT NULL DEFAULT 0,
            last_run_id TEXT
        )""",
        """CREATE TABLE messages (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            role TEXT NOT NULL,
            message TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            principal TEXT NOT NULL,
            agent TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT,
            input TEXT NOT NULL,
            output TEXT,
            error TEXT,
            usage TEXT,
            metadata TEXT NOT NULL
        )""",
        "CREATE INDEX runs_by_session ON runs (session_id, created_at)",
        """CREATE INDEX runs_unfinished ON runs (created_at)
            WHERE status IN ('queued', 'running', 'waiting')""",
    ),
)
SCHEMA_VERSION: Final = len(_MIGRATIONS)

# How long a statement waits for another process's write lock before giving up.
_BUSY_TIMEOUT_SECONDS: Final = 10.0

_SESSION_COLUMNS: Final = "id, principal, created_at, updated_at, message_count, last_run_id"
_MESSAGE_COLUMNS: Final = "session_id, run_id, position, role, message, created_at"
_RUN_COLUMNS: Final = (
    "run_id, session_id, principal, agent, status, created_at, started_at, finished_at,"
    " input, output, error, usage, metadata"
)
_TERMINAL_SQL: Final = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))


def _ts(value: datetime) -> str:
    # Fixed-width UTC text sorts in time order, so ORDER BY created_at works on TEXT.
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _optional_ts(value: datetime | None) -> str | None:
    return None if value is None else _ts(value)


def _parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _parse_optional_ts(text: str | None) -> datetime | None:
    return None if text is None else _parse_ts(text)


def _session(row: sqlite3.Row) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        principal=row["principal"],
        created_at=_parse_ts(row["created_at"]),
        updated_at=_parse_ts(row["updated_at"]),
        message_count=row["message_count"],
        last_run_id=row["last_run_id"],
    )


def _message(row: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        session_id=row["session_id"],
        run_id=row["run_id"],
        position=row["position"],
        role=row["role"],
        message=decode_json(row["message"]),
        created_at=_parse_ts(row["created_at"]),
    )


def _run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        session_id=row["session_id"],
        principal=row["principal"],
        agent=row["agent"],
        status=row["status"],
        created_at=_parse_ts(row["created_at"]),
        started_at=_parse_optional_ts(row["started_at"]),
        finished_at=_parse_optional_ts(row["finished_at"]),
        input=row["input"],
        output=decode_optional_json(row["output"]),
        error=decode_optional_json(row["error"]),
        usage=decode_optional_json(row["usage"]),
        metadata=decode_json(row["metadata"]),
    )


def _make_parent_dirs(path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)


class SQLiteStore(BackgroundOperations):
    """A `Store` in one SQLite file (or in memory). Open it with `await SQLiteStore.connect()`."""

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        super().__init__()
        self._conn: aiosqlite.Connection | None = conn
        self._path = path
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @classmethod
    async def connect(cls, path: str) -> SQLiteStore:
        """Open (creating parent directories and the file) and migrate the database at `path`.

        `path` is a file path or ":memory:". Raises `StorageUnavailable` if it cannot be
        opened.
        """
        try:
            if path != ":memory:":
                await asyncio.to_thread(_make_parent_dirs, path)
            conn = await aiosqlite.connect(
                path, isolation_level=None, timeout=_BUSY_TIMEOUT_SECONDS
            )
        except (OSError, sqlite3.Error) as exc:
            raise StorageUnavailable(f"cannot open SQLite database {path!r}: {exc}") from exc
        store = cls(conn, path)
        try:
            conn.row_factory = sqlite3.Row
            async with store._connection() as c:
                # WAL lets readers in other processes proceed during a write; NORMAL
                # synchronisation is durable against process crashes, which is what a
                # worker restart needs, at a fraction of FULL's fsyncs.
                await _use_wal(c)
                await c.execute("PRAGMA synchronous = NORMAL")
                await c.execute("PRAGMA foreign_keys = ON")
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Refuse new calls, let those in flight finish, then close. Idempotent."""
        await self._finish_operations()
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()

    @finish_on_cancel
    async def migrate(self) -> int:
        """Bring the schema up to date (idempotent); return its version."""
        async with self._transaction() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version"
                " (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
            )
            rows = await conn.execute_fetchall(
                "SELECT COALESCE(MAX(version), 0) FROM schema_version"
            )
            current: int = next(iter(rows))[0]
            if current > SCHEMA_VERSION:
                raise StorageError(
                    f"the database {self._path!r} has schema version {current}, newer than"
                    f" this code's {SCHEMA_VERSION}: upgrade the service"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version - 1]:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, _ts(utcnow())),
                )
        return max(current, SCHEMA_VERSION)

    @finish_on_cancel
    async def ping(self) -> None:
        """Run a trivial query; raises `StorageUnavailable`."""
        async with self._connection() as conn:
            await conn.execute_fetchall("SELECT 1")

    # --- sessions -------------------------------------------------------------------------

    @finish_on_cancel
    async def get_or_create_session(self, session_id: str, principal: str) -> SessionRecord:
        """Return the session, creating it for `principal` on first use."""
        now = _ts(utcnow())
        async with self._transaction() as conn:
            await conn.execute(
                "INSERT OR IGNORE INTO sessions (id, principal, created_at, updated_at)"
                " VALUES (?, ?, ?, ?)",
                (session_id, principal, now, now),
            )
            row = await _one(
                conn, f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            )
        assert row is not None  # inserted or already there, inside one transaction
        record = _session(row)
        if record.principal != principal:
            raise SessionOwnedByOther(session_id)
        return record

    @finish_on_cancel
    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None."""
        async with self._connection() as conn:
            row = await _one(
                conn, f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            )
        return None if row is None else _session(row)

    @finish_on_cancel
    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its messages and runs (by ON DELETE CASCADE)."""
        async with self._transaction() as conn:
            cursor = await conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            return cursor.rowcount > 0

    # --- messages -------------------------------------------------------------------------

    @finish_on_cancel
    async def list_messages(self, session_id: str) -> list[StoredMessage]:
        """The conversation in order."""
        async with self._connection() as conn:
            rows = await conn.execute_fetchall(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY position",
                (session_id,),
            )
        return [_message(row) for row in rows]

    @finish_on_cancel
    async def append_messages(
        self, session_id: str, run_id: str, messages: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append one run's messages atomically; an empty sequence changes nothing."""
        if not messages:
            return
        now = _ts(utcnow())
        async with self._transaction() as conn:
            row = await _one(conn, "SELECT message_count FROM sessions WHERE id = ?", (session_id,))
            if row is None:
                raise SessionNotFound(session_id)
            start: int = row["message_count"]
            await conn.execute(
                "UPDATE sessions SET message_count = message_count + ?, last_run_id = ?,"
                " updated_at = ? WHERE id = ?",
                (len(messages), run_id, now, session_id),
            )
            # Encoding happens inside the transaction: a bad message rolls back the
            # session update above along with any rows, leaving nothing half-written.
            rows = [
                (session_id, run_id, start + i, message_role(i, m), encode_json(m), now)
                for i, m in enumerate(messages)
            ]
            await conn.executemany(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows
            )

    # --- runs -----------------------------------------------------------------------------

    @finish_on_cancel
    async def create_run(self, run: RunRecord) -> None:
        """Store a new run of an existing session owned by `run.principal`."""
        async with self._transaction() as conn:
            row = await _one(conn, "SELECT principal FROM sessions WHERE id = ?", (run.session_id,))
            if row is None:
                raise SessionNotFound(run.session_id)
            if row["principal"] != run.principal:
                raise SessionOwnedByOther(run.session_id)
            try:
                await conn.execute(
                    f"INSERT INTO runs ({_RUN_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run.run_id,
                        run.session_id,
                        run.principal,
                        run.agent,
                        run.status,
                        _ts(run.created_at),
                        _optional_ts(run.started_at),
                        _optional_ts(run.finished_at),
                        run.input,
                        encode_optional_json(run.output),
                        encode_optional_json(run.error),
                        encode_optional_json(run.usage),
                        encode_json(run.metadata),
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise RunAlreadyExists(run.run_id) from exc

    @finish_on_cancel
    async def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus,
        output: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
    ) -> RunRecord:
        """Move a run to `status`; see `Store.update_run`."""
        started, finished = run_update_stamps(status, started_at, finished_at)
        auto_started, auto_finished = _optional_ts(started), _optional_ts(finished)
        async with self._transaction() as conn:
            await conn.execute(
                "UPDATE runs SET status = ?, output = COALESCE(?, output),"
                " error = COALESCE(?, error), usage = COALESCE(?, usage),"
                " started_at = COALESCE(?, started_at, ?),"
                " finished_at = COALESCE(?, finished_at, ?)"
                f" WHERE run_id = ? AND status NOT IN ({_TERMINAL_SQL})",
                (
                    status,
                    encode_optional_json(output),
                    encode_optional_json(error),
                    encode_optional_json(usage),
                    _optional_ts(started_at),
                    auto_started,
                    _optional_ts(finished_at),
                    auto_finished,
                    run_id,
                ),
            )
            row = await _one(conn, f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        if row is None:
            raise RunNotFound(run_id)
        return _run(row)

    @finish_on_cancel
    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""
        async with self._connection() as conn:
            row = await _one(conn, f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return None if row is None else _run(row)

    @finish_on_cancel
    async def list_runs(self, session_id: str, limit: int = 20) -> list[RunRecord]:
        """The session's most recent runs, newest first."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        async with self._connection() as conn:
            rows = await conn.execute_fetchall(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE session_id = ?"
                " ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (session_id, limit),
            )
        return [_run(row) for row in rows]

    @finish_on_cancel
    async def list_unfinished_runs(self) -> list[RunRecord]:
        """Runs still queued, running or waiting, oldest first."""
        async with self._connection() as conn:
            rows = await conn.execute_fetchall(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE status IN ('queued', 'running', 'waiting')"
                " ORDER BY created_at, rowid"
            )
        return [_run(row) for row in rows]

    # --- plumbing -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, to this task alone; SQLite's operational errors become ours."""
        async with self._lock:
            if self._conn is None:
                raise StorageUnavailable(f"the SQLite store {self._path!r} is closed")
            try:
                yield self._conn
            except sqlite3.OperationalError as exc:
                # Locked beyond the busy timeout, disk full, I/O error, file gone.
                raise StorageUnavailable(f"SQLite database {self._path!r}: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction, committed on success and rolled back on any exception.

        IMMEDIATE takes the write lock up front, so a transaction that reads and then writes
        cannot fail half-way on another process's lock.
        """
        async with self._connection() as conn:
            try:
                await conn.execute("BEGIN IMMEDIATE")
                yield conn
                await conn.commit()
            except BaseException:
                # Even when cancelled, the ROLLBACK is queued on the connection's thread
                # before the lock is released, so the next user finds no open transaction.
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise


async def _use_wal(conn: aiosqlite.Connection) -> None:
    """Switch the file to WAL, retrying while another process does the same.

    Changing the journal mode needs an exclusive lock, and SQLite reports "database is
    locked" at once rather than waiting on the busy timeout when several workers open a new
    file together; so retry, within that timeout, until one of them has made the switch.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_SECONDS
    delay = 0.005
    while True:
        try:
            rows = await conn.execute_fetchall("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
            continue
        mode = str(next(iter(rows))[0]).lower()
        if mode not in ("wal", "memory"):
            logger.warning("SQLite database kept journal mode %r instead of WAL", mode)
        return


async def _one(
    conn: aiosqlite.Connection, sql: str, parameters: Iterable[Any]
) -> sqlite3.Row | None:
    rows = await conn.execute_fetchall(sql, parameters)
    return next(iter(rows), None)
