"""The SQLite schema: its migrations, one entry per version, and how a database is brought up
to date (on the store's thread, in one transaction of its)."""

from __future__ import annotations

import sqlite3
from datetime import UTC
from typing import Final

from app.storage import outbox
from app.storage.base import StorageError, utcnow
from app.storage.sqlite.checkpoints import CHECKPOINTS_MIGRATION
from app.storage.sqlite.files import FILES_MIGRATION
from app.storage.sqlite.schedules import SCHEDULES_MIGRATION
from app.storage.sqlite.threads import THREADS_MIGRATION

__all__ = ["BOOK_USAGE_SELECT", "MIGRATIONS", "SCHEMA_VERSION", "migrate"]

# the usage row of a finished run, from its runs row (``day``: the UTC date of its end; the
# cache and reasoning counts NULL where the run's usage does not report them)
BOOK_USAGE_SELECT: Final = (
    "(run_id, principal, agent, model, day, finished_at, input_tokens, output_tokens,"
    " cached_input_tokens, cache_write_tokens, reasoning_tokens)"
    " SELECT run_id, principal, agent, model, substr(finished_at, 1, 10), finished_at,"
    " COALESCE(json_extract(usage, '$.input_tokens'), 0),"
    " COALESCE(json_extract(usage, '$.output_tokens'), 0),"
    " json_extract(usage, '$.cached_input_tokens'), json_extract(usage, '$.cache_write_tokens'),"
    " json_extract(usage, '$.reasoning_tokens') FROM runs"
)
# the same as version 5 wrote it (a shipped migration never changes)
_BOOK_USAGE_SELECT_5: Final = (
    "(run_id, principal, agent, model, day, finished_at, input_tokens, output_tokens)"
    " SELECT run_id, principal, agent, model, substr(finished_at, 1, 10), finished_at,"
    " COALESCE(json_extract(usage, '$.input_tokens'), 0),"
    " COALESCE(json_extract(usage, '$.output_tokens'), 0) FROM runs"
)

# Each entry is one schema version; never edit a shipped entry, append a new one.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
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
    # 2: a principal's sessions, newest first, read page by page (list_sessions)
    ("CREATE INDEX IF NOT EXISTS sessions_by_principal ON sessions (principal, updated_at, id)",),
    # 3: a session's own title; the model that answered a run
    (
        "ALTER TABLE sessions ADD COLUMN title TEXT",
        "ALTER TABLE runs ADD COLUMN model TEXT",
    ),
    # 4: the highest fencing token that wrote each run and each session's messages (fenced
    # writes compare it in their WHERE clause; see app.storage.base)
    (
        "ALTER TABLE runs ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
    ),
    # 5: the usage ledger, one row per finished run, kept when its session is deleted;
    # filled from the runs already finished
    (
        """CREATE TABLE IF NOT EXISTS usage (
            run_id TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            agent TEXT NOT NULL,
            model TEXT,
            day TEXT NOT NULL,
            finished_at TEXT NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS usage_by_time ON usage (finished_at)",
        "CREATE INDEX IF NOT EXISTS usage_by_principal ON usage (principal, finished_at)",
        f"""INSERT OR IGNORE INTO usage {_BOOK_USAGE_SELECT_5}
            WHERE usage IS NOT NULL AND finished_at IS NOT NULL""",
    ),
    # 6: schedules and their firings (app.storage.sqlite.schedules)
    SCHEDULES_MIGRATION,
    # 7: the webhook outbox and its delivery attempts (app.storage.outbox)
    outbox.SQLITE_MIGRATION,
    # 8: each unfinished run's last checkpoint (app.storage.sqlite.checkpoints)
    CHECKPOINTS_MIGRATION,
    # 9: where a run's notifications go, for whoever ends it
    ("ALTER TABLE runs ADD COLUMN webhook_url TEXT",),
    # 10: sessions of stateless protocol calls: not listed, deleted once idle past the
    # retention (app.runs.stateless); the listing reads its own index, without them
    (
        "ALTER TABLE sessions ADD COLUMN stateless INTEGER NOT NULL DEFAULT 0",
        """CREATE INDEX IF NOT EXISTS sessions_listed ON sessions (principal, updated_at, id)
            WHERE stateless = 0""",
        """CREATE INDEX IF NOT EXISTS sessions_stateless ON sessions (updated_at)
            WHERE stateless = 1""",
    ),
    # 11: the metadata of a thread (a session, as the LangGraph-compatible API names it)
    THREADS_MIGRATION,
    # 12: the usage ledger's prompt-cache and reasoning counts, NULL where the provider
    # reported none (no backfill: no provider reported them before this version)
    (
        "ALTER TABLE usage ADD COLUMN cached_input_tokens INTEGER",
        "ALTER TABLE usage ADD COLUMN cache_write_tokens INTEGER",
        "ALTER TABLE usage ADD COLUMN reasoning_tokens INTEGER",
    ),
    # 13: uploaded files, their blobs and the sessions that refer to them
    # (app.storage.sqlite.files)
    FILES_MIGRATION,
    # 14: a run's input given as content parts (media by file id), as JSON
    ("ALTER TABLE runs ADD COLUMN input_parts TEXT",),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: str) -> int:
    """Apply the migrations ``db`` (the file at ``path``) lacks; its schema version."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_version"
        " (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    current: int = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
    if current > SCHEMA_VERSION:
        raise StorageError(
            f"the database {path!r} has schema version {current}, newer than"
            f" this code's {SCHEMA_VERSION}: upgrade the service"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1]:
            db.execute(statement)
        applied = utcnow().astimezone(UTC).isoformat(timespec="microseconds")
        db.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, applied)
        )
    return max(current, SCHEMA_VERSION)
