"""Thread metadata in SQLite (see ``app.storage.threads``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any, Final

from app.storage.base import BackgroundOperations, SessionRecord, encode_json
from app.storage.rows import SQLITE, session_record
from app.storage.threads import ThreadQuery

__all__ = ["THREADS_MIGRATION", "SQLiteThreads"]

THREADS_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS thread_metadata (
        session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
        metadata TEXT NOT NULL
    )""",
)

_COLUMNS: Final = (
    "s.id, s.principal, s.created_at, s.updated_at, s.message_count, s.last_run_id, s.title,"
    " s.stateless"
)


class SQLiteThreads(BackgroundOperations):
    """The thread-metadata part of ``SQLiteStore``."""

    async def _read(self, function: Any, *args: Any) -> Any:  # pragma: no cover - the store's
        raise NotImplementedError

    async def _write(self, function: Any, *args: Any) -> Any:  # pragma: no cover - the store's
        raise NotImplementedError

    async def set_thread_metadata(self, session_id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the session's metadata object."""
        await self._write(_set, session_id, encode_json(metadata))

    async def thread_metadata(self, session_id: str) -> dict[str, Any]:
        """The session's metadata object ({} when it has none)."""
        found: dict[str, Any] = await self._read(_get, session_id)
        return found

    async def search_threads(
        self, query: ThreadQuery
    ) -> list[tuple[SessionRecord, dict[str, Any]]]:
        """The principal's sessions the query matches, with their metadata, in its order."""
        found: list[tuple[SessionRecord, dict[str, Any]]] = await self._read(_search, query)
        return found


def _set(db: sqlite3.Connection, session_id: str, metadata: str) -> None:
    db.execute(
        "INSERT INTO thread_metadata (session_id, metadata) VALUES (?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET metadata = excluded.metadata",
        (session_id, metadata),
    )


def _get(db: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    row = db.execute(
        "SELECT metadata FROM thread_metadata WHERE session_id = ?", (session_id,)
    ).fetchone()
    value = json.loads(row[0]) if row is not None else {}
    return value if isinstance(value, dict) else {}


def _search(
    db: sqlite3.Connection, query: ThreadQuery
) -> list[tuple[SessionRecord, dict[str, Any]]]:
    where = ["s.principal = ?", "s.stateless = 0"]
    params: list[Any] = [query.principal]
    for key, value in query.metadata.items():
        # the key matched METADATA_KEY (ThreadQuery), so the path needs no quoting
        where.append("json_extract(COALESCE(m.metadata, '{}'), ?) IS json_extract(?, '$')")
        params += [f"$.{key}", json.dumps(value)]
    if query.session_ids is not None:
        where.append(f"s.id IN ({', '.join('?' for _ in query.session_ids)})")
        params += list(query.session_ids)
    order = "DESC" if query.descending else "ASC"
    rows = db.execute(
        f"SELECT {_COLUMNS}, m.metadata AS thread_metadata FROM sessions s"
        " LEFT JOIN thread_metadata m ON m.session_id = s.id"
        f" WHERE {' AND '.join(where)}"
        f" ORDER BY s.{query.sort_by} {order}, s.id {order} LIMIT ? OFFSET ?",
        (*params, query.limit, query.offset),
    ).fetchall()
    found = []
    for row in rows:
        metadata = json.loads(row["thread_metadata"]) if row["thread_metadata"] else {}
        found.append((session_record(row, SQLITE), metadata if isinstance(metadata, dict) else {}))
    return found
