"""Where sessions, conversations and runs live: `open_store(url)` picks the backend."""

from __future__ import annotations

from typing import Literal

from app.storage.base import (
    TERMINAL_STATUSES,
    UNFINISHED_STATUSES,
    JSONObject,
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
    StorageError,
    StorageUnavailable,
    Store,
    StoredMessage,
    UsageGroup,
    UsageTotal,
)
from app.storage.checkpoints import CheckpointRecord
from app.storage.files import FileInUse, FileMissing, FileRecord, FileStore, FileSweep
from app.storage.outbox import (
    ClaimedWebhook,
    WebhookAttempt,
    WebhookMessage,
    WebhookState,
    WebhookStatus,
)
from app.storage.postgres.store import PostgresStore, redact_url
from app.storage.sqlite.store import SQLiteStore

__all__ = [
    "TERMINAL_STATUSES",
    "UNFINISHED_STATUSES",
    "CheckpointRecord",
    "ClaimedWebhook",
    "FileInUse",
    "FileMissing",
    "FileRecord",
    "FileStore",
    "FileSweep",
    "JSONObject",
    "PostgresStore",
    "RunAlreadyExists",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "SQLiteStore",
    "SessionCursor",
    "SessionNotFound",
    "SessionOwnedByOther",
    "SessionRecord",
    "StaleFence",
    "StorageConfigError",
    "StorageError",
    "StorageUnavailable",
    "Store",
    "StoredMessage",
    "UsageGroup",
    "UsageTotal",
    "WebhookAttempt",
    "WebhookMessage",
    "WebhookState",
    "WebhookStatus",
    "database_kind",
    "open_store",
    "redact_url",
    "sqlite_path",
]

_POSTGRES_SCHEMES = frozenset({"postgresql", "postgres", "postgresql+asyncpg"})
_EXAMPLES = "sqlite:///./var/agent.db, sqlite:////abs/path.db, sqlite:///:memory: or postgresql://user@host/db"


def sqlite_path(url: str) -> str:
    """The file path (or ":memory:") a sqlite:// URL names.

    `sqlite:///rel/path.db` is relative to the working directory, `sqlite:////abs.db` is
    absolute, as in SQLAlchemy; `sqlite://:memory:` and `sqlite:///:memory:` are in memory.
    """
    rest = url.partition("://")[2]
    if rest in (":memory:", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/") or rest == "/":
        raise StorageConfigError(
            f"AGENT_DATABASE_URL {url!r} names no SQLite file; use {_EXAMPLES}"
        )
    return rest[1:]


async def open_store(url: str, *, timeout: float = 30.0) -> Store:  # noqa: ASYNC109
    """Open and migrate the store AGENT_DATABASE_URL names.

    Raises `StorageConfigError` (a ValueError) for a URL it cannot use and
    `StorageUnavailable` when the database cannot be opened or reached. ``timeout`` bounds
    each PostgreSQL operation (connecting, waiting for a pooled connection, the command).
    """
    if database_kind(url) == "sqlite":
        return await SQLiteStore.connect(sqlite_path(url))
    return await PostgresStore.connect(url, operation_timeout=timeout)


def database_kind(url: str) -> Literal["sqlite", "postgresql"]:
    """``sqlite`` or ``postgresql``: the store AGENT_DATABASE_URL names; raises
    `StorageConfigError` for a URL no store takes (checked before any worker starts)."""
    scheme, separator, _ = url.partition("://")
    scheme = scheme.lower()
    if separator and scheme == "sqlite":
        sqlite_path(url)
        return "sqlite"
    if separator and scheme in _POSTGRES_SCHEMES:
        return "postgresql"
    # Name the scheme only: the rest of the URL may hold a password.
    shown = f"scheme {scheme!r}" if separator else "value"
    raise StorageConfigError(f"AGENT_DATABASE_URL has an unsupported {shown}; use {_EXAMPLES}")
