"""The PostgreSQL backend, on an asyncpg pool, with JSONB columns.

Why asyncpg: it is asyncio-native (no thread pool between the event loop and the socket),
speaks PostgreSQL's binary protocol with prepared statements cached per connection (the
fastest Python driver by a wide margin on small queries like ours), has its own pool with
per-call timeouts, and maps server errors to precise exception classes, which this module
turns into the store's own. The store needs no ORM: a handful of statements, written here.
psycopg 3's async mode would also do; asyncpg was chosen for speed and its pool.

Every statement runs through `PostgresStore._connection`, the one place where asyncpg's and
the socket's errors become `StorageUnavailable`. Messages never carry the URL's password:
`redact_url` and `_scrub` see to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

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
    StorageConfigError,
    StorageUnavailable,
    StoredMessage,
    UsageGroup,
    UsageTotal,
    encode_json,
    encode_optional_json,
    encode_parts,
    finish_on_cancel,
    message_role,
    run_update_stamps,
    title_of,
    utcnow,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.postgres.checkpoints import PostgresCheckpoints, drop_checkpoint, write_checkpoint
from app.storage.postgres.files import PostgresFiles
from app.storage.postgres.schedules import PostgresSchedules, take_firing
from app.storage.postgres.schema import (
    BOOK_USAGE_COLUMNS,
    BOOK_USAGE_VALUES,
    SCHEMA_VERSION,
    migrate,
)
from app.storage.postgres.threads import PostgresThreads
from app.storage.rows import (
    POSTGRES,
    USAGE_SUMS,
    run_record,
    session_record,
    stored_message,
    usage_total,
)
from app.storage.schedules import FiringFence

__all__ = ["SCHEMA_VERSION", "PostgresStore", "redact_url"]


_SESSION_COLUMNS: Final = (
    "id, principal, created_at, updated_at, message_count, last_run_id, title, stateless"
)
_MESSAGE_COLUMNS: Final = "session_id, run_id, position, role, message, created_at"
_RUN_COLUMNS: Final = (
    "run_id, session_id, principal, agent, status, created_at, started_at, finished_at,"
    " input, output, error, usage, metadata, model, webhook_url, input_parts"
)
_TERMINAL_SQL: Final = ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES))
# a stateless session the retention may delete: idle since the cut-off ($1), no run going on
_IDLE_STATELESS: Final = (
    "stateless AND updated_at < $1 AND NOT EXISTS (SELECT 1 FROM runs"
    f" WHERE runs.session_id = sessions.id AND runs.status NOT IN ({_TERMINAL_SQL}))"
)
_USAGE_KEYS: Final = {"agent": "agent", "principal": "principal", "day": "day"}

# What a lost or refused connection looks like. DataError is an InterfaceError too, but it
# means a bad argument value (a caller bug), so `_connection` lets it through first.
_UNAVAILABLE: Final[tuple[type[BaseException], ...]] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InsufficientResourcesError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
)
# At open, any refusal by the server (bad password, no such database) is also "unavailable".
_OPEN_FAILURES: Final[tuple[type[BaseException], ...]] = (*_UNAVAILABLE, asyncpg.PostgresError)


def redact_url(url: str) -> str:
    """`url` with its password (in the user part or the query) replaced by `***`."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostinfo = netloc.rpartition("@")
            netloc = f"{userinfo.partition(':')[0]}:***@{hostinfo}"
        query = urlencode(
            [
                (key, "***" if key == "password" else value)
                for key, value in parse_qsl(parts.query, keep_blank_values=True)
            ],
            safe="*",
        )
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparseable URL>"


def _secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    found += [v for k, v in parse_qsl(parts.query) if k == "password" and v]
    return [s for secret in found for s in {secret, unquote(secret)}]


def _scrub(text: str, secrets: Sequence[str]) -> str:
    # Belt and braces: asyncpg's messages do not echo passwords today; make sure they never do.
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


class PostgresStore(PostgresCheckpoints, PostgresSchedules, PostgresThreads, PostgresFiles):
    """A `Store` in PostgreSQL. Open it with `await PostgresStore.connect(url)`."""

    def __init__(self, pool: asyncpg.Pool, safe_url: str, *, timeout: float) -> None:
        super().__init__()
        self._pool = pool
        self._safe_url = safe_url
        self._timeout = timeout
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresStore({self._safe_url!r})"

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        operation_timeout: float = 30.0,
        server_settings: Mapping[str, str] | None = None,
    ) -> PostgresStore:
        """Open a pool on `url` (postgresql:// or postgres://) and migrate the schema.

        Query parameters asyncpg does not know become server settings, so
        `?search_path=myschema` selects a schema. `operation_timeout` bounds connecting, each
        statement and the wait for a pooled connection. Raises `StorageUnavailable` when the
        server cannot be reached or refuses us, `StorageConfigError` for a malformed URL.
        """
        safe_url, secrets = redact_url(url), _secrets(url)
        dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=operation_timeout,
                command_timeout=operation_timeout,
                server_settings=dict(server_settings) if server_settings else None,
            )
        # `from None`: the original exception's text is scrubbed into ours instead, so a
        # traceback cannot carry the password either.
        except (asyncpg.ClientConfigurationError, ValueError) as exc:
            message = _scrub(str(exc), secrets)
            raise StorageConfigError(
                f"AGENT_DATABASE_URL {safe_url} is not a valid PostgreSQL URL: {message}"
            ) from None
        except _OPEN_FAILURES as exc:
            message = _scrub(f"{type(exc).__name__}: {exc}", secrets)
            raise StorageUnavailable(
                f"cannot connect to PostgreSQL at {safe_url}: {message}"
            ) from None
        store = cls(pool, safe_url, timeout=operation_timeout)
        try:
            await store.migrate()
        except asyncpg.PostgresError as exc:  # no such schema, no right to create in it...
            await store.close()
            message = _scrub(f"{type(exc).__name__}: {exc}", secrets)
            raise StorageConfigError(
                f"cannot set up the tables in the database at {safe_url}: {message}"
            ) from None
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Refuse new calls, let those in flight finish, then close the pool. Idempotent."""
        await self._finish_operations()
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self._pool.close(), self._timeout)
        except TimeoutError:
            self._pool.terminate()

    @finish_on_cancel
    async def migrate(self) -> int:
        """Bring the schema up to date (idempotent, safe from many workers at once).

        Returns the schema version.
        """
        async with self._connection() as conn, conn.transaction():
            return await migrate(conn, self._safe_url)

    @finish_on_cancel
    async def ping(self) -> None:
        """Run a trivial query; raises `StorageUnavailable`."""
        async with self._connection() as conn:
            await conn.fetchval("SELECT 1")

    # --- sessions -------------------------------------------------------------------------

    @finish_on_cancel
    async def get_or_create_session(
        self, session_id: str, principal: str, *, stateless: bool = False
    ) -> SessionRecord:
        """Return the session, creating it for `principal` on first use."""
        async with self._connection() as conn:
            # Two statements, not one: a row inserted by a concurrent transaction is skipped
            # by ON CONFLICT yet invisible to a SELECT in the same statement. The loop covers
            # a delete that lands between them.
            for _ in range(3):
                now = utcnow()
                row = await conn.fetchrow(
                    "INSERT INTO sessions (id, principal, created_at, updated_at, stateless)"
                    " VALUES ($1, $2, $3, $3, $4) ON CONFLICT (id) DO NOTHING"
                    f" RETURNING {_SESSION_COLUMNS}",
                    session_id,
                    principal,
                    now,
                    stateless,
                )
                if row is None:
                    row = await conn.fetchrow(
                        f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = $1", session_id
                    )
                if row is not None:
                    break
            else:
                raise StorageUnavailable(f"session {session_id!r} keeps being deleted")
        record = session_record(row, POSTGRES)
        if record.principal != principal:
            raise SessionOwnedByOther(session_id)
        return record

    @finish_on_cancel
    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None."""
        async with self._connection() as conn:
            row = await conn.fetchrow(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = $1", session_id
            )
        return None if row is None else session_record(row, POSTGRES)

    @finish_on_cancel
    async def delete_session(self, session_id: str) -> bool:
        """Delete the session, its messages and runs (by ON DELETE CASCADE)."""
        async with self._connection() as conn:
            deleted = await conn.fetchval(
                "DELETE FROM sessions WHERE id = $1 RETURNING id", session_id
            )
        return deleted is not None

    @finish_on_cancel
    async def list_sessions(
        self, principal: str, limit: int = 20, before: SessionCursor | None = None
    ) -> list[SessionRecord]:
        """The principal's sessions, most recently updated first; see `Store.list_sessions`."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        async with self._connection() as conn:
            if before is None:
                rows = await conn.fetch(
                    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE principal = $1"
                    " AND NOT stateless ORDER BY updated_at DESC, id DESC LIMIT $2",
                    principal,
                    limit,
                )
            else:
                # a row comparison: one range scan of sessions_listed
                rows = await conn.fetch(
                    f"SELECT {_SESSION_COLUMNS} FROM sessions"
                    " WHERE principal = $1 AND NOT stateless AND (updated_at, id) < ($2, $3)"
                    " ORDER BY updated_at DESC, id DESC LIMIT $4",
                    principal,
                    before.updated_at,
                    before.session_id,
                    limit,
                )
        return [session_record(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def set_title(self, session_id: str, title: str) -> SessionRecord | None:
        """Set the session's title; see `Store.set_title`."""
        async with self._connection() as conn:
            row = await conn.fetchrow(
                f"UPDATE sessions SET title = $2 WHERE id = $1 RETURNING {_SESSION_COLUMNS}",
                session_id,
                title,
            )
        return None if row is None else session_record(row, POSTGRES)

    @finish_on_cancel
    async def idle_stateless_sessions(self, before: datetime, limit: int) -> list[str]:
        """Stateless sessions idle since before `before`; see `Store.idle_stateless_sessions`."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT id FROM sessions WHERE {_IDLE_STATELESS} ORDER BY updated_at LIMIT $2",
                before,
                limit,
            )
        return [row["id"] for row in rows]

    @finish_on_cancel
    async def delete_idle_stateless_session(self, session_id: str, before: datetime) -> bool:
        """Delete an idle stateless session; see `Store.delete_idle_stateless_session`."""
        async with self._connection() as conn:
            deleted = await conn.fetchval(
                f"DELETE FROM sessions WHERE id = $2 AND {_IDLE_STATELESS} RETURNING id",
                before,
                session_id,
            )
        return deleted is not None

    # --- messages -------------------------------------------------------------------------

    @finish_on_cancel
    async def list_messages(self, session_id: str) -> list[StoredMessage]:
        """The conversation in order."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = $1 ORDER BY position",
                session_id,
            )
        return [stored_message(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def append_messages(
        self,
        session_id: str,
        run_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        fence: int | None = None,
    ) -> None:
        """Append one run's messages atomically; an empty sequence changes nothing."""
        if not messages:
            return
        async with self._connection() as conn, conn.transaction():
            await _append(conn, session_id, run_id, messages, fence)

    @finish_on_cancel
    async def remove_last_turn(self, session_id: str, run_id: str) -> bool:
        """Remove the run's messages if they end the conversation; see `Store.remove_last_turn`."""
        async with self._connection() as conn, conn.transaction():
            # the session row's lock orders this against appends to the same session
            exists = await conn.fetchval(
                "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", session_id
            )
            if exists is None:
                return True
            first: int | None = await conn.fetchval(
                "SELECT min(position) FROM messages WHERE session_id = $1 AND run_id = $2",
                session_id,
                run_id,
            )
            if first is None:
                return True  # the run stored nothing
            later = await conn.fetchval(
                "SELECT 1 FROM messages WHERE session_id = $1 AND position > $2"
                " AND run_id != $3 LIMIT 1",
                session_id,
                first,
                run_id,
            )
            if later is not None:
                return False
            removed = await conn.fetch(
                "DELETE FROM messages WHERE session_id = $1 AND run_id = $2 RETURNING position",
                session_id,
                run_id,
            )
            await conn.execute(
                "UPDATE sessions SET message_count = message_count - $2, updated_at = $3,"
                " last_run_id = (SELECT run_id FROM messages WHERE session_id = $1"
                " ORDER BY position DESC LIMIT 1) WHERE id = $1",
                session_id,
                len(removed),
                utcnow(),
            )
        return True

    # --- runs -----------------------------------------------------------------------------

    @finish_on_cancel
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
        title = title_of(run.input)
        async with self._connection() as conn, conn.transaction():
            owner: str | None = None
            if create_session:
                # a row another transaction inserts meanwhile is skipped here and read below;
                # the row this one inserts is locked until the commit (and has its title)
                now = utcnow()
                owner = await conn.fetchval(
                    "INSERT INTO sessions (id, principal, created_at, updated_at, stateless, title)"
                    " VALUES ($1, $2, $3, $3, $4, $5) ON CONFLICT (id) DO NOTHING"
                    " RETURNING principal",
                    run.session_id,
                    run.principal,
                    now,
                    stateless,
                    title,
                )
            created = owner is not None
            if owner is None:
                # FOR KEY SHARE keeps the session from being deleted before the INSERT.
                owner = await conn.fetchval(
                    "SELECT principal FROM sessions WHERE id = $1 FOR KEY SHARE", run.session_id
                )
            if owner is None:
                raise SessionNotFound(run.session_id)
            if owner != run.principal:
                raise SessionOwnedByOther(run.session_id)
            try:
                await conn.execute(
                    f"INSERT INTO runs ({_RUN_COLUMNS})"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,"
                    " $16)",
                    run.run_id,
                    run.session_id,
                    run.principal,
                    run.agent,
                    run.status,
                    run.created_at,
                    run.started_at,
                    run.finished_at,
                    run.input,
                    encode_optional_json(run.output),
                    encode_optional_json(run.error),
                    encode_optional_json(run.usage),
                    encode_json(run.metadata),
                    run.model,
                    run.webhook_url,
                    encode_parts(run.input_parts),
                )
            except asyncpg.UniqueViolationError as exc:
                raise RunAlreadyExists(run.run_id) from exc
            if firing is not None:  # in the same transaction: refused, the insert is undone
                await take_firing(conn, firing, run.run_id)
            if checkpoint is not None:  # a new run: no token can be newer than its own
                await write_checkpoint(conn, checkpoint, checkpoint.fence)
            if title is not None and not created:
                await conn.execute(
                    "UPDATE sessions SET title = $2 WHERE id = $1 AND title IS NULL",
                    run.session_id,
                    title,
                )

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
        model: str | None = None,
        fence: int | None = None,
        webhook: outbox.WebhookMessage | None = None,
    ) -> RunRecord:
        """Move a run to `status`; see `Store.update_run`."""
        parameters = _update_parameters(
            run_id, status, output, error, usage, started_at, finished_at, model, fence
        )
        async with self._connection() as conn, contextlib.AsyncExitStack() as stack:
            if webhook is not None:  # the run's write and its notification: one commit
                await stack.enter_async_context(conn.transaction())
            record, _ = await _update(conn, parameters, webhook)
        return record

    @finish_on_cancel
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
        # the session's row is locked before the run's (by the append), as no other
        # transaction takes them the other way round
        async with self._connection() as conn, conn.transaction():
            if messages:
                await _append(conn, session_id, run_id, messages, fence)
            _, ended = await _update(conn, parameters, webhook)
            if delete_checkpoint:
                await drop_checkpoint(conn, run_id, fence)
        return ended

    @finish_on_cancel
    async def usage_totals(
        self,
        *,
        start: datetime,
        end: datetime,
        group_by: UsageGroup,
        principal: str | None = None,
    ) -> list[UsageTotal]:
        """Tokens of the runs finished in ``[start, end)``; see ``Store.usage_totals``."""
        column = _USAGE_KEYS[group_by]  # a fixed column name, never the caller's text
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {column}::text, {USAGE_SUMS}"
                " FROM usage WHERE finished_at >= $1 AND finished_at < $2"
                " AND ($3::text IS NULL OR principal = $3)"
                f" GROUP BY {column} ORDER BY {column}",
                start,
                end,
                principal,
            )
        return [usage_total(row) for row in rows]

    @finish_on_cancel
    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""
        async with self._connection() as conn:
            row = await conn.fetchrow(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = $1", run_id)
        return None if row is None else run_record(row, POSTGRES)

    @finish_on_cancel
    async def list_runs(self, session_id: str, limit: int | None = 20) -> list[RunRecord]:
        """The session's most recent runs, newest first; all of them with `limit=None`."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE session_id = $1"
                " ORDER BY created_at DESC, run_id DESC LIMIT $2",
                session_id,
                limit,
            )
        return [run_record(row, POSTGRES) for row in rows]

    @finish_on_cancel
    async def list_unfinished_runs(self) -> list[RunRecord]:
        """Runs still queued, running or waiting, oldest first."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_RUN_COLUMNS} FROM runs"
                " WHERE status IN ('queued', 'running', 'waiting') ORDER BY created_at, run_id"
            )
        return [run_record(row, POSTGRES) for row in rows]

    # --- the webhook outbox (app.storage.outbox) -------------------------------------------

    @finish_on_cancel
    async def claim_webhooks(
        self, claim: str, *, now: float, until: float, limit: int
    ) -> list[outbox.ClaimedWebhook]:
        """Claim up to ``limit`` due messages until ``until``; see ``Store.claim_webhooks``."""
        async with self._connection() as conn:
            return await outbox.postgres_claim(conn, claim, now, until, limit)

    @finish_on_cancel
    async def record_webhook_attempt(
        self,
        claimed: outbox.ClaimedWebhook,
        attempt: outbox.WebhookAttempt,
        *,
        state: outbox.WebhookStatus,
        next_attempt_at: float,
    ) -> bool:
        """Record an attempt under its claim; see ``Store.record_webhook_attempt``."""
        async with self._connection() as conn:
            return await outbox.postgres_record(conn, claimed, attempt, state, next_attempt_at)

    @finish_on_cancel
    async def prune_webhooks(self, *, before: float, limit: int) -> int:
        """Delete settled messages past their retention; see ``Store.prune_webhooks``."""
        async with self._connection() as conn:
            return await outbox.postgres_prune(conn, before, limit)

    @finish_on_cancel
    async def webhook_states(self, run_id: str) -> list[outbox.WebhookState]:
        """The run's webhook messages and their attempts."""
        async with self._connection() as conn:
            return await outbox.postgres_states(conn, run_id)

    # --- plumbing -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A pooled connection; the one place connection failures become ours."""
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                yield conn
        except asyncpg.DataError:
            raise
        except _UNAVAILABLE as exc:
            raise StorageUnavailable(
                f"PostgreSQL at {self._safe_url} is unavailable: {type(exc).__name__}: {exc}"
            ) from exc


# --- statements shared by the single writes and a run's end (``end_run``) ----------------------


async def _append(
    conn: Any,
    session_id: str,
    run_id: str,
    messages: Sequence[Mapping[str, Any]],
    fence: int | None,
) -> None:
    """``append_messages`` on ``conn``, inside the caller's transaction."""
    now = utcnow()
    # The UPDATE locks the session row, so concurrent appends to one session queue up
    # instead of colliding on positions. A fenced one changes the row only while neither the
    # session's messages nor the run were written with a newer token.
    start: int | None = await conn.fetchval(
        "UPDATE sessions SET message_count = message_count + $2, last_run_id = $3,"
        " updated_at = $4, fence = GREATEST(fence, COALESCE($5::bigint, 0))"
        " WHERE id = $1 AND ($5::bigint IS NULL OR (fence <= $5::bigint AND NOT EXISTS"
        " (SELECT 1 FROM runs WHERE run_id = $3 AND fence > $5::bigint)))"
        " RETURNING message_count - $2",
        session_id,
        len(messages),
        run_id,
        now,
        fence,
    )
    if start is None:
        row = await conn.fetchrow(
            "SELECT s.fence, (SELECT r.fence FROM runs r WHERE r.run_id = $2) AS run_fence"
            " FROM sessions s WHERE s.id = $1",
            session_id,
            run_id,
        )
        if row is None or fence is None:
            raise SessionNotFound(session_id)
        raise StaleFence(f"session {session_id!r}", fence, max(row["fence"], row["run_fence"] or 0))
    # Encoding happens inside the transaction: a bad message rolls back the session update
    # above, leaving nothing half-written.
    rows = [
        (session_id, run_id, start + i, message_role(i, m), encode_json(m), now)
        for i, m in enumerate(messages)
    ]
    await conn.executemany(
        f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)", rows
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
    """The parameters of ``_update``'s statement (checked, encoded, stamped)."""
    auto_started, auto_finished = run_update_stamps(status, started_at, finished_at)
    return (
        run_id,
        status,
        encode_optional_json(output),
        encode_optional_json(error),
        encode_optional_json(usage),
        started_at,
        auto_started,
        finished_at,
        auto_finished,
        model,
        fence,
    )


async def _update(
    conn: Any, parameters: tuple[Any, ...], webhook: outbox.WebhookMessage | None
) -> tuple[RunRecord, bool]:
    """``update_run`` on ``conn`` (in the caller's transaction when there is a webhook): the
    run as stored, and whether this changed it (False: it had ended before)."""
    run_id, fence = parameters[0], parameters[-1]
    # one statement: the move to a terminal status books the run's usage with it; the fence
    # is compared in the same statement that writes: no write with an older token can land
    # after one with a newer token, whatever the interleaving
    row = await conn.fetchrow(
        "WITH updated AS (UPDATE runs SET status = $2,"
        " output = COALESCE($3::jsonb, output),"
        " error = COALESCE($4::jsonb, error), usage = COALESCE($5::jsonb, usage),"
        " started_at = COALESCE($6::timestamptz, started_at, $7::timestamptz),"
        " finished_at = COALESCE($8::timestamptz, finished_at, $9::timestamptz),"
        " model = COALESCE($10::text, model),"
        " fence = GREATEST(fence, COALESCE($11::bigint, 0))"
        f" WHERE run_id = $1 AND status NOT IN ({_TERMINAL_SQL})"
        " AND ($11::bigint IS NULL OR fence <= $11::bigint)"
        f" RETURNING {_RUN_COLUMNS}),"
        f" booked AS (INSERT INTO usage {BOOK_USAGE_COLUMNS}"
        f" SELECT {BOOK_USAGE_VALUES} FROM updated"
        f" WHERE status IN ({_TERMINAL_SQL}) AND usage IS NOT NULL"
        " AND finished_at IS NOT NULL ON CONFLICT DO NOTHING)"
        f" SELECT {_RUN_COLUMNS} FROM updated",
        *parameters,
    )
    changed = row is not None
    if changed and webhook is not None:
        await outbox.postgres_enqueue(conn, webhook)
    if row is None:  # finished already, fenced off, or unknown
        row = await conn.fetchrow(
            f"SELECT {_RUN_COLUMNS}, fence FROM runs WHERE run_id = $1", run_id
        )
        if row is not None and fence is not None and row["fence"] > fence:
            raise StaleFence(f"run {run_id!r}", fence, row["fence"])
    if row is None:
        raise RunNotFound(run_id)
    return run_record(row, POSTGRES), changed
