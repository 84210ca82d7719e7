"""The SQLite backend: one connection on a thread of its own, WAL, JSON as TEXT.

Each store operation is one plain function run on that thread (statements, transaction and
the conversion of rows into records together), so the event loop never waits on disk or on
another process's lock, and an operation costs one hand-off to the thread and back, however
many statements it runs. The thread runs operations one at a time, in the order they were
submitted, which is what keeps one operation's statements out of another's transaction
(``app.storage.sqlite.jobs``). The few short operations of a run's way (its session, a short
conversation, its start, a small checkpoint, its status, its end) run on the loop instead, on
a connection of their own, when they can without waiting
(``app.storage.sqlite.loop_connection``).

An operation of one hand-off needs no task of its own to outlive a cancelled caller (as
``finish_on_cancel`` gives the PostgreSQL store's): once submitted it runs on the thread
whatever happens to its caller, and ``close`` queues the connection's close after it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from app.storage import outbox
from app.storage.base import (
    TERMINAL_STATUSES,
    RunAlreadyExists,
    RunNotFound,
    RunRecord,
    RunStatus,
    SessionCursor,
    SessionNotFound,
    SessionOwnedByOther,
    SessionRecord,
    StaleFence,
    StorageUnavailable,
    StoredMessage,
    UsageGroup,
    UsageTotal,
    encode_json,
    encode_optional_json,
    encode_parts,
    run_update_stamps,
    title_of,
    utcnow,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.rows import (
    SQLITE,
    USAGE_SUMS,
    run_record,
    session_record,
    usage_total,
)
from app.storage.schedules import FiringFence
from app.storage.sqlite.checkpoints import SQLiteCheckpoints, drop_checkpoint, insert_checkpoint
from app.storage.sqlite.files import SQLiteFiles
from app.storage.sqlite.jobs import JobThread
from app.storage.sqlite.loop_connection import LoopConnection, in_transaction
from app.storage.sqlite.messages import (
    delete_last_turn,
    insert_messages,
    select_messages,
    select_short_conversation,
)
from app.storage.sqlite.schedules import SQLiteSchedules, take_firing
from app.storage.sqlite.schema import BOOK_USAGE_SELECT, SCHEMA_VERSION, migrate
from app.storage.sqlite.threads import SQLiteThreads
from app.storage.sqlite.timestamps import optional_ts, ts

logger = logging.getLogger("app.storage")

T = TypeVar("T")

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]


# How long a statement waits for another process's write lock before giving up.
_BUSY_TIMEOUT_SECONDS: Final = 10.0

_SESSION_COLUMNS: Final = (
    "id, principal, created_at, updated_at, message_count, last_run_id, title, stateless"
)
_RUN_COLUMNS: Final = (
    "run_id, session_id, principal, agent, status, created_at, started_at, finished_at,"
    " input, output, error, usage, metadata, model, webhook_url, input_parts"
)
_TERMINAL_SQL: Final = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))


def _make_parent_dirs(path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)


class SQLiteStore(SQLiteCheckpoints, SQLiteSchedules, SQLiteThreads, SQLiteFiles):
    """A `Store` in one SQLite file (or in memory). Open it with `await SQLiteStore.connect()`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._db: sqlite3.Connection | None = None  # used on the store's thread only
        self._jobs = JobThread("sqlite-store")
        self._on_loop = LoopConnection(self._jobs, self._checkpoint_wal)
        self._closed = False
        self._closing_db: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @classmethod
    async def connect(cls, path: str) -> SQLiteStore:
        """Open (creating parent directories and the file) and migrate the database at `path`.

        `path` is a file path or ":memory:". Raises `StorageUnavailable` if it cannot be
        opened.
        """
        store = cls(path)
        try:
            await store._call(store._open)
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Refuse new calls, let those in flight finish, then close. Idempotent."""
        await self._finish_operations()
        if self._closing_db is None:
            self._closing_db = asyncio.ensure_future(self._close_db())
        await asyncio.shield(self._closing_db)

    async def _close_db(self) -> None:
        try:
            await self._call(self._close_on_thread)
        finally:
            self._closed = True
            self._jobs.stop()

    async def migrate(self) -> int:
        """Bring the schema up to date (idempotent); return its version."""
        return await self._write(migrate, self._path)

    async def ping(self) -> None:
        """Run a trivial query; raises `StorageUnavailable`."""
        await self._read(_ping)

    # --- sessions -------------------------------------------------------------------------

    async def get_or_create_session(
        self, session_id: str, principal: str, *, stateless: bool = False
    ) -> SessionRecord:
        """Return the session, creating it for `principal` on first use."""
        record = await self._write(_get_or_create_session, session_id, principal, stateless)
        if record.principal != principal:
            raise SessionOwnedByOther(session_id)
        return record

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None."""
        return await self._quick_read(_get_session, session_id)

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its messages and runs (by ON DELETE CASCADE)."""
        return await self._write(_delete_session, session_id)

    async def list_sessions(
        self, principal: str, limit: int = 20, before: SessionCursor | None = None
    ) -> list[SessionRecord]:
        """The principal's sessions, most recently updated first; see `Store.list_sessions`."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        return await self._read(_list_sessions, principal, limit, before)

    async def set_title(self, session_id: str, title: str) -> SessionRecord | None:
        """Set the session's title; see `Store.set_title`."""
        return await self._write(_set_title, session_id, title)

    async def idle_stateless_sessions(self, before: datetime, limit: int) -> list[str]:
        """Stateless sessions idle since before `before`; see `Store.idle_stateless_sessions`."""
        return await self._read(_idle_stateless_sessions, ts(before), limit)

    async def delete_idle_stateless_session(self, session_id: str, before: datetime) -> bool:
        """Delete an idle stateless session; see `Store.delete_idle_stateless_session`."""
        return await self._write(_delete_idle_stateless_session, session_id, ts(before))

    # --- messages -------------------------------------------------------------------------

    async def list_messages(self, session_id: str) -> list[StoredMessage]:
        """The conversation in order."""
        # a run reads its conversation on its way: a short one on the loop's connection
        listed = await self._quick_read(select_short_conversation, session_id)
        if listed is None:
            listed = await self._read(select_messages, session_id)
        return listed

    async def append_messages(
        self,
        session_id: str,
        run_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        fence: int | None = None,
    ) -> None:
        """Append one run's messages atomically; an empty sequence changes nothing."""
        if messages:
            await self._write(insert_messages, session_id, run_id, messages, fence)

    async def remove_last_turn(self, session_id: str, run_id: str) -> bool:
        """Remove the run's messages if they end the conversation; see `Store.remove_last_turn`."""
        return await self._write(delete_last_turn, session_id, run_id)

    # --- runs -----------------------------------------------------------------------------

    async def create_run(
        self,
        run: RunRecord,
        *,
        firing: FiringFence | None = None,
        create_session: bool = False,
        stateless: bool = False,
        checkpoint: CheckpointRecord | None = None,
    ) -> None:
        """Store a new run of a session owned by `run.principal`; see `Store.create_run`."""
        await self._quick_write(_create_run, run, firing, create_session, stateless, checkpoint)

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
        model: str | None = None,
        fence: int | None = None,
        webhook: outbox.WebhookMessage | None = None,
    ) -> RunRecord:
        """Move a run to `status`; see `Store.update_run`."""
        parameters = _update_parameters(
            run_id, status, output, error, usage, started_at, finished_at, model, fence
        )
        record = await self._quick_write(_update_run, run_id, parameters, fence, webhook)
        if record is None:
            raise RunNotFound(run_id)
        return record

    async def end_run(
        self,
        run_id: str,
        *,
        session_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        status: RunStatus,
        output: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        model: str | None = None,
        fence: int | None = None,
        webhook: outbox.WebhookMessage | None = None,
        delete_checkpoint: bool = False,
    ) -> bool:
        """A run's end in one transaction; see `Store.end_run`."""
        parameters = _update_parameters(
            run_id, status, output, error, usage, None, None, model, fence
        )
        return await self._quick_write(
            _end_run, session_id, run_id, messages, parameters, fence, webhook, delete_checkpoint
        )

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""
        return await self._quick_read(_get_run, run_id)

    async def list_runs(self, session_id: str, limit: int | None = 20) -> list[RunRecord]:
        """The session's most recent runs, newest first; all of them with `limit=None`."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        return await self._read(_list_runs, session_id, limit)

    async def list_unfinished_runs(self) -> list[RunRecord]:
        """Runs still queued, running or waiting, oldest first."""
        return await self._read(_list_unfinished_runs)

    async def usage_totals(
        self,
        *,
        start: datetime,
        end: datetime,
        group_by: UsageGroup,
        principal: str | None = None,
    ) -> list[UsageTotal]:
        """Tokens of the runs finished in ``[start, end)``; see ``Store.usage_totals``."""
        return await self._read(_usage_totals, ts(start), ts(end), group_by, principal)

    # --- the webhook outbox (app.storage.outbox) -------------------------------------------

    async def claim_webhooks(
        self, claim: str, *, now: float, until: float, limit: int
    ) -> list[outbox.ClaimedWebhook]:
        """Claim up to ``limit`` due messages until ``until``; see ``Store.claim_webhooks``."""
        return await self._write(outbox.sqlite_claim, claim, now, until, limit)

    async def record_webhook_attempt(
        self,
        claimed: outbox.ClaimedWebhook,
        attempt: outbox.WebhookAttempt,
        *,
        state: outbox.WebhookStatus,
        next_attempt_at: float,
    ) -> bool:
        """Record an attempt under its claim; see ``Store.record_webhook_attempt``."""
        return await self._write(outbox.sqlite_record, claimed, attempt, state, next_attempt_at)

    async def prune_webhooks(self, *, before: float, limit: int) -> int:
        """Delete settled messages past their retention; see ``Store.prune_webhooks``."""
        return await self._write(outbox.sqlite_prune, before, limit)

    async def webhook_states(self, run_id: str) -> list[outbox.WebhookState]:
        """The run's webhook messages and their attempts."""
        return await self._read(outbox.sqlite_states, run_id)

    # --- plumbing: on the event loop --------------------------------------------------------

    async def _call(self, function: Callable[..., T], *args: Any) -> T:
        """Run `function(*args)` on the store's thread; SQLite's operational errors become ours."""
        return await self._hop(function.__name__, function, *args)

    async def _read(self, function: Callable[..., T], *args: Any) -> T:
        """`function(db, *args)` on the store's thread."""
        result: T = await self._hop(function.__name__, self._on_connection, function, *args)
        return result

    async def _write(self, function: Callable[..., T], *args: Any) -> T:
        """`function(db, *args)` in one write transaction on the store's thread."""
        result: T = await self._hop(function.__name__, self._in_transaction, function, *args)
        return result

    async def _quick_read(self, function: Callable[..., T], *args: Any) -> T:
        """`function(db, *args)`, on the loop's connection when it can run without waiting
        (else as `_read`); for an operation on a few rows by key."""
        return await self._short(function, args, write=False)

    async def _quick_write(self, function: Callable[..., T], *args: Any) -> T:
        """`function(db, *args)` in one write transaction, on the loop's connection when it
        can run without waiting (else as `_write`); for an operation on a few rows by key."""
        return await self._short(function, args, write=True)

    async def _short(self, function: Callable[..., T], args: tuple[Any, ...], *, write: bool) -> T:
        if self._closed:
            raise StorageUnavailable(f"the SQLite store {self._path!r} is closed")
        on_thread = self._in_transaction if write else self._on_connection
        try:
            return await self._on_loop.short(function, args, write=write, on_thread=on_thread)
        except sqlite3.OperationalError as exc:
            raise StorageUnavailable(f"SQLite database {self._path!r}: {exc}") from exc

    async def _hop(self, name: str, function: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StorageUnavailable(f"the SQLite store {self._path!r} is closed")
        try:
            return await self._on_loop.on_thread(name, function, *args)
        except sqlite3.OperationalError as exc:
            # Locked beyond the busy timeout, disk full, I/O error, file gone.
            raise StorageUnavailable(f"SQLite database {self._path!r}: {exc}") from exc

    # --- plumbing: on the store's thread ----------------------------------------------------

    def _open(self) -> None:
        if self._path != ":memory:":
            _make_parent_dirs(self._path)
        try:
            db = sqlite3.connect(self._path, isolation_level=None, timeout=_BUSY_TIMEOUT_SECONDS)
        except (OSError, sqlite3.Error) as exc:
            raise StorageUnavailable(f"cannot open SQLite database {self._path!r}: {exc}") from exc
        self._db = db
        db.row_factory = sqlite3.Row
        # WAL lets readers in other processes proceed during a write; NORMAL synchronisation
        # is durable against process crashes, which is what a worker restart needs, at a
        # fraction of FULL's fsyncs.
        _use_wal(db)
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        try:
            self._on_loop.open(self._path)
        except sqlite3.Error as exc:
            db.close()
            self._db = None
            raise StorageUnavailable(f"cannot open SQLite database {self._path!r}: {exc}") from exc

    def _close_on_thread(self) -> None:
        self._on_loop.close()
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise StorageUnavailable(f"the SQLite store {self._path!r} is closed")
        return self._db

    def _checkpoint_wal(self) -> None:
        # PASSIVE copies what no reader still needs, and never waits for a lock
        self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _on_connection(self, function: Callable[..., T], *args: Any) -> T:
        return function(self._connection(), *args)

    def _in_transaction(self, function: Callable[..., T], *args: Any) -> T:
        """`function(db, *args)` in one write transaction (see `in_transaction`)."""
        return in_transaction(self._connection(), function, *args)


# --- operations, each run on the store's thread -----------------------------------------------


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL, retrying while another process does the same.

    Changing the journal mode needs an exclusive lock, and SQLite reports "database is
    locked" at once rather than waiting on the busy timeout when several workers open a new
    file together; so retry, within that timeout, until one of them has made the switch.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_SECONDS
    delay = 0.005
    while True:
        try:
            mode = str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)  # on the store's thread, not the event loop
            delay = min(delay * 2, 0.1)
            continue
        if mode not in ("wal", "memory"):
            logger.warning("SQLite database kept journal mode %r instead of WAL", mode)
        return


def _ping(db: sqlite3.Connection) -> None:
    db.execute("SELECT 1").fetchall()


def _get_session(db: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    row = db.execute(
        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    return None if row is None else session_record(row, SQLITE)


def _get_or_create_session(
    db: sqlite3.Connection, session_id: str, principal: str, stateless: bool
) -> SessionRecord:
    now = ts(utcnow())
    db.execute(
        "INSERT OR IGNORE INTO sessions (id, principal, created_at, updated_at, stateless)"
        " VALUES (?, ?, ?, ?, ?)",
        (session_id, principal, now, now, int(stateless)),
    )
    record = _get_session(db, session_id)
    assert record is not None  # inserted or already there, inside one transaction
    return record


def _list_sessions(
    db: sqlite3.Connection, principal: str, limit: int, before: SessionCursor | None
) -> list[SessionRecord]:
    # A row value comparison, which SQLite answers with a range scan of sessions_listed
    # (fixed-width UTC text sorts in time order); ``stateless = 0`` is that index's own
    # condition, written the same way so that SQLite uses it.
    if before is None:
        rows = db.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE principal = ? AND stateless = 0"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (principal, limit),
        ).fetchall()
    else:
        rows = db.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions"
            " WHERE principal = ? AND stateless = 0 AND (updated_at, id) < (?, ?)"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (principal, ts(before.updated_at), before.session_id, limit),
        ).fetchall()
    return [session_record(row, SQLITE) for row in rows]


def _set_title(db: sqlite3.Connection, session_id: str, title: str) -> SessionRecord | None:
    db.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
    return _get_session(db, session_id)


# a stateless session the retention may delete: idle since the cut-off, no run going on
_IDLE_STATELESS: Final = (
    "stateless = 1 AND updated_at < ? AND NOT EXISTS (SELECT 1 FROM runs"
    f" WHERE runs.session_id = sessions.id AND runs.status NOT IN ({_TERMINAL_SQL}))"
)


def _idle_stateless_sessions(db: sqlite3.Connection, before: str, limit: int) -> list[str]:
    rows = db.execute(
        f"SELECT id FROM sessions WHERE {_IDLE_STATELESS} ORDER BY updated_at LIMIT ?",
        (before, limit),
    ).fetchall()
    return [row["id"] for row in rows]


def _delete_idle_stateless_session(db: sqlite3.Connection, session_id: str, before: str) -> bool:
    deleted = db.execute(
        f"DELETE FROM sessions WHERE id = ? AND {_IDLE_STATELESS}", (session_id, before)
    ).rowcount
    return deleted > 0


def _delete_session(db: sqlite3.Connection, session_id: str) -> bool:
    return db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0


def _create_run(
    db: sqlite3.Connection,
    run: RunRecord,
    firing: FiringFence | None,
    create_session: bool,
    stateless: bool,
    checkpoint: CheckpointRecord | None,
) -> None:
    title = title_of(run.input)
    # a session created here is the run's principal's, titled by its input: nothing to read
    # back or update (the fewer statements, the fewer hand-offs of the GIL on this thread)
    created = create_session and _insert_session(db, run, stateless, title)
    if not created:
        row = db.execute(
            "SELECT principal FROM sessions WHERE id = ?", (run.session_id,)
        ).fetchone()
        if row is None:
            raise SessionNotFound(run.session_id)
        if row["principal"] != run.principal:
            raise SessionOwnedByOther(run.session_id)
    try:
        db.execute(
            f"INSERT INTO runs ({_RUN_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run.run_id,
                run.session_id,
                run.principal,
                run.agent,
                run.status,
                ts(run.created_at),
                optional_ts(run.started_at),
                optional_ts(run.finished_at),
                run.input,
                encode_optional_json(run.output),
                encode_optional_json(run.error),
                encode_optional_json(run.usage),
                encode_json(run.metadata),
                run.model,
                run.webhook_url,
                encode_parts(run.input_parts),
            ),
        )
    except sqlite3.IntegrityError as exc:
        raise RunAlreadyExists(run.run_id) from exc
    if firing is not None:  # in the same transaction: refused, the insert is rolled back
        take_firing(db, firing, run.run_id)
    if checkpoint is not None:  # a new run: no token can be newer than its own
        insert_checkpoint(db, checkpoint, checkpoint.fence)
    if title is not None and not created:
        db.execute(
            "UPDATE sessions SET title = ? WHERE id = ? AND title IS NULL", (title, run.session_id)
        )


def _insert_session(
    db: sqlite3.Connection, run: RunRecord, stateless: bool, title: str | None
) -> bool:
    """Create the run's session unless it exists; whether this did."""
    now = ts(utcnow())
    return bool(
        db.execute(
            "INSERT OR IGNORE INTO sessions"
            " (id, principal, created_at, updated_at, stateless, title) VALUES (?, ?, ?, ?, ?, ?)",
            (run.session_id, run.principal, now, now, int(stateless), title),
        ).rowcount
    )


def _update_parameters(
    run_id: str,
    status: RunStatus,
    output: Mapping[str, Any] | None,
    error: Mapping[str, Any] | None,
    usage: Mapping[str, Any] | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    model: str | None,
    fence: int | None,
) -> tuple[Any, ...]:
    """The parameters of ``_update_run``'s statement (checked, encoded, stamped)."""
    started, finished = run_update_stamps(status, started_at, finished_at)
    return (
        status,
        encode_optional_json(output),
        encode_optional_json(error),
        encode_optional_json(usage),
        model,
        optional_ts(started_at),
        optional_ts(started),
        optional_ts(finished_at),
        optional_ts(finished),
        fence,
        run_id,
        fence,
        fence,
    )


def _update_run(
    db: sqlite3.Connection,
    run_id: str,
    parameters: tuple[Any, ...],
    fence: int | None,
    webhook: outbox.WebhookMessage | None,
) -> RunRecord | None:
    try:
        _change_run(db, run_id, parameters, fence, webhook)
    except RunNotFound:
        return None
    return _get_run(db, run_id)


def _change_run(
    db: sqlite3.Connection,
    run_id: str,
    parameters: tuple[Any, ...],
    fence: int | None,
    webhook: outbox.WebhookMessage | None,
) -> bool:
    """``_update_run``'s write: whether it changed the run (False: it had ended before)."""
    # the fence is compared in the statement that writes (see app.storage.base)
    changed = db.execute(
        "UPDATE runs SET status = ?, output = COALESCE(?, output),"
        " error = COALESCE(?, error), usage = COALESCE(?, usage), model = COALESCE(?, model),"
        " started_at = COALESCE(?, started_at, ?),"
        " finished_at = COALESCE(?, finished_at, ?), fence = MAX(fence, COALESCE(?, 0))"
        f" WHERE run_id = ? AND status NOT IN ({_TERMINAL_SQL}) AND (? IS NULL OR fence <= ?)",
        parameters,
    ).rowcount
    if not changed:
        row = db.execute("SELECT fence FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        if fence is not None and row["fence"] > fence:
            raise StaleFence(f"run {run_id!r}", fence, row["fence"])
        return False
    if parameters[0] in TERMINAL_STATUSES:
        # the run's end books its tokens, in the same transaction
        db.execute(
            f"INSERT OR IGNORE INTO usage {BOOK_USAGE_SELECT}"
            " WHERE run_id = ? AND usage IS NOT NULL AND finished_at IS NOT NULL",
            (run_id,),
        )
    if webhook is not None:
        outbox.sqlite_enqueue(db, webhook)  # the run's write and its notification: one commit
    return True


def _end_run(
    db: sqlite3.Connection,
    session_id: str,
    run_id: str,
    messages: Sequence[Mapping[str, Any]],
    parameters: tuple[Any, ...],
    fence: int | None,
    webhook: outbox.WebhookMessage | None,
    delete_checkpoint: bool,
) -> bool:
    # one transaction: an error in any part (a stale token, a bad message) rolls back all
    if messages:
        insert_messages(db, session_id, run_id, messages, fence)
    ended = _change_run(db, run_id, parameters, fence, webhook)
    if delete_checkpoint:
        drop_checkpoint(db, run_id, fence)
    return ended


_USAGE_KEYS: Final = {"agent": "agent", "principal": "principal", "day": "day"}


def _usage_totals(
    db: sqlite3.Connection, start: str, end: str, group_by: str, principal: str | None
) -> list[UsageTotal]:
    column = _USAGE_KEYS[group_by]  # a fixed column name, never the caller's text
    where = "finished_at >= ? AND finished_at < ?"
    parameters: list[Any] = [start, end]
    if principal is not None:
        where += " AND principal = ?"
        parameters.append(principal)
    rows = db.execute(
        f"SELECT {column}, {USAGE_SUMS} FROM usage"
        f" WHERE {where} GROUP BY {column} ORDER BY {column}",
        parameters,
    ).fetchall()
    return [usage_total(row) for row in rows]


def _get_run(db: sqlite3.Connection, run_id: str) -> RunRecord | None:
    row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else run_record(row, SQLITE)


def _list_runs(db: sqlite3.Connection, session_id: str, limit: int | None) -> list[RunRecord]:
    rows = db.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE session_id = ?"
        " ORDER BY created_at DESC, rowid DESC LIMIT ?",
        (session_id, -1 if limit is None else limit),
    ).fetchall()
    return [run_record(row, SQLITE) for row in rows]


def _list_unfinished_runs(db: sqlite3.Connection) -> list[RunRecord]:
    rows = db.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE status IN ('queued', 'running', 'waiting')"
        " ORDER BY created_at, rowid"
    ).fetchall()
    return [run_record(row, SQLITE) for row in rows]
