"""The PostgreSQL schema: its migrations, one entry per version, and how a database is brought
up to date (in one transaction, under an advisory lock, safe from many workers at once)."""

from __future__ import annotations

from typing import Any, Final

from app.storage import outbox
from app.storage.base import StorageError
from app.storage.postgres.checkpoints import CHECKPOINTS_MIGRATION
from app.storage.postgres.files import FILES_MIGRATION
from app.storage.postgres.schedules import SCHEDULES_MIGRATION
from app.storage.postgres.threads import THREADS_MIGRATION

__all__ = ["BOOK_USAGE_COLUMNS", "BOOK_USAGE_VALUES", "MIGRATIONS", "SCHEMA_VERSION", "migrate"]

# the usage row of a finished run, from its runs row (``day``: the UTC date of its end; the
# cache and reasoning counts NULL where the run's usage does not report them)
BOOK_USAGE_COLUMNS: Final = (
    "(run_id, principal, agent, model, day, finished_at, input_tokens, output_tokens,"
    " cached_input_tokens, cache_write_tokens, reasoning_tokens)"
)
BOOK_USAGE_VALUES: Final = (
    "run_id, principal, agent, model, (finished_at AT TIME ZONE 'UTC')::date, finished_at,"
    " COALESCE((usage->>'input_tokens')::bigint, 0),"
    " COALESCE((usage->>'output_tokens')::bigint, 0),"
    " (usage->>'cached_input_tokens')::bigint, (usage->>'cache_write_tokens')::bigint,"
    " (usage->>'reasoning_tokens')::bigint"
)
# the same as version 5 wrote them (a shipped migration never changes)
_BOOK_USAGE_COLUMNS_5: Final = (
    "(run_id, principal, agent, model, day, finished_at, input_tokens, output_tokens)"
)
_BOOK_USAGE_VALUES_5: Final = (
    "run_id, principal, agent, model, (finished_at AT TIME ZONE 'UTC')::date, finished_at,"
    " COALESCE((usage->>'input_tokens')::bigint, 0), COALESCE((usage->>'output_tokens')::bigint, 0)"
)

# Each entry is one schema version; never edit a shipped entry, append a new one.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE sessions (
            id text PRIMARY KEY,
            principal text NOT NULL,
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            message_count integer NOT NULL DEFAULT 0,
            last_run_id text
        )""",
        """CREATE TABLE messages (
            session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            position integer NOT NULL,
            run_id text NOT NULL,
            role text NOT NULL,
            message jsonb NOT NULL,
            created_at timestamptz NOT NULL,
            PRIMARY KEY (session_id, position)
        )""",
        """CREATE TABLE runs (
            run_id text PRIMARY KEY,
            session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            principal text NOT NULL,
            agent text NOT NULL,
            status text NOT NULL,
            created_at timestamptz NOT NULL,
            started_at timestamptz,
            finished_at timestamptz,
            input text NOT NULL,
            output jsonb,
            error jsonb,
            usage jsonb,
            metadata jsonb NOT NULL
        )""",
        "CREATE INDEX runs_by_session ON runs (session_id, created_at)",
        """CREATE INDEX runs_unfinished ON runs (created_at)
            WHERE status IN ('queued', 'running', 'waiting')""",
    ),
    # 2: a principal's sessions, newest first, read page by page (list_sessions). Not
    # CONCURRENTLY: that cannot run in the migration's transaction, and the transaction (with
    # its advisory lock) is what keeps workers starting together from migrating twice. IF NOT
    # EXISTS: on a large table an operator builds it CONCURRENTLY beforehand (docs/deploy.md).
    ("CREATE INDEX IF NOT EXISTS sessions_by_principal ON sessions (principal, updated_at, id)",),
    # 3: a session's own title; the model that answered a run
    (
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS title text",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS model text",
    ),
    # 4: the highest fencing token that wrote each run and each session's messages (fenced
    # writes compare it in their WHERE clause; see app.storage.base)
    (
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0",
    ),
    # 5: the usage ledger, one row per finished run, kept when its session is deleted;
    # filled from the runs already finished
    (
        """CREATE TABLE IF NOT EXISTS usage (
            run_id text PRIMARY KEY,
            principal text NOT NULL,
            agent text NOT NULL,
            model text,
            day date NOT NULL,
            finished_at timestamptz NOT NULL,
            input_tokens bigint NOT NULL,
            output_tokens bigint NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS usage_by_time ON usage (finished_at)",
        "CREATE INDEX IF NOT EXISTS usage_by_principal ON usage (principal, finished_at)",
        f"""INSERT INTO usage {_BOOK_USAGE_COLUMNS_5} SELECT {_BOOK_USAGE_VALUES_5} FROM runs
            WHERE usage IS NOT NULL AND finished_at IS NOT NULL ON CONFLICT DO NOTHING""",
    ),
    # 6: schedules and their firings (app.storage.postgres.schedules)
    SCHEDULES_MIGRATION,
    # 7: the webhook outbox and its delivery attempts (app.storage.outbox)
    outbox.POSTGRES_MIGRATION,
    # 8: each unfinished run's last checkpoint (app.storage.postgres.checkpoints)
    CHECKPOINTS_MIGRATION,
    # 9: where a run's notifications go, for whoever ends it
    ("ALTER TABLE runs ADD COLUMN IF NOT EXISTS webhook_url text",),
    # 10: sessions of stateless protocol calls: not listed, deleted once idle past the
    # retention (app.runs.stateless); the listing reads its own index, without them (on a large
    # table, build both CONCURRENTLY beforehand, as for 2)
    (
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS stateless boolean NOT NULL DEFAULT false",
        """CREATE INDEX IF NOT EXISTS sessions_listed ON sessions (principal, updated_at, id)
            WHERE NOT stateless""",
        "CREATE INDEX IF NOT EXISTS sessions_stateless ON sessions (updated_at) WHERE stateless",
    ),
    # 11: the metadata of a thread (a session, as the LangGraph-compatible API names it)
    THREADS_MIGRATION,
    # 12: the usage ledger's prompt-cache and reasoning counts, NULL where the provider
    # reported none (no backfill: no provider reported them before this version)
    (
        "ALTER TABLE usage ADD COLUMN IF NOT EXISTS cached_input_tokens bigint",
        "ALTER TABLE usage ADD COLUMN IF NOT EXISTS cache_write_tokens bigint",
        "ALTER TABLE usage ADD COLUMN IF NOT EXISTS reasoning_tokens bigint",
    ),
    # 13: uploaded files, their blobs (in pieces) and the sessions that refer to them
    # (app.storage.postgres.files)
    FILES_MIGRATION,
    # 14: a run's input given as content parts (media by file id)
    ("ALTER TABLE runs ADD COLUMN IF NOT EXISTS input_parts jsonb",),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)

# Any fixed number works; it only has to differ from other applications' advisory locks
# in the same database. Taken inside the migration transaction, it is released at commit.
MIGRATION_LOCK_KEY: Final = 0x6167_656E_7473_746F  # "agentsto"


async def migrate(conn: Any, where: str) -> int:
    """Apply the migrations the database lacks, in the caller's transaction on ``conn`` (the
    database at ``where``, for messages); its schema version."""
    # Serialise concurrent migrators first: even CREATE TABLE IF NOT EXISTS races with
    # itself in PostgreSQL (a duplicate key in pg_type).
    await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version"
        " (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    current: int = await conn.fetchval("SELECT COALESCE(max(version), 0) FROM schema_version")
    if current > SCHEMA_VERSION:
        raise StorageError(
            f"the database at {where} has schema version {current}, newer"
            f" than this code's {SCHEMA_VERSION}: upgrade the service"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1]:
            await conn.execute(statement)
        await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", version)
    return max(current, SCHEMA_VERSION)
