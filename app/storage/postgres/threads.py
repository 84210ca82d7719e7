"""Thread metadata in PostgreSQL (see ``app.storage.threads``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Final

from app.storage.base import BackgroundOperations, SessionRecord, encode_json, finish_on_cancel
from app.storage.rows import POSTGRES, session_record
from app.storage.threads import ThreadQuery

__all__ = ["THREADS_MIGRATION", "PostgresThreads"]

THREADS_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS thread_metadata (
        session_id text PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
        metadata jsonb NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS thread_metadata_values ON thread_metadata USING gin (metadata)",
)

_COLUMNS: Final = (
    "s.id, s.principal, s.created_at, s.updated_at, s.message_count, s.last_run_id, s.title,"
    " s.stateless"
)


class PostgresThreads(BackgroundOperations):
    """The thread-metadata part of ``PostgresStore``."""

    def _connection(  # pragma: no cover - overridden by PostgresStore
        self,
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @finish_on_cancel
    async def set_thread_metadata(self, session_id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the session's metadata object."""
        async with self._connection() as conn:
            await conn.execute(
                "INSERT INTO thread_metadata (session_id, metadata) VALUES ($1, $2::jsonb)"
                " ON CONFLICT (session_id) DO UPDATE SET metadata = excluded.metadata",
                session_id,
                encode_json(metadata),
            )

    @finish_on_cancel
    async def thread_metadata(self, session_id: str) -> dict[str, Any]:
        """The session's metadata object ({} when it has none)."""
        async with self._connection() as conn:
            text = await conn.fetchval(
                "SELECT metadata::text FROM thread_metadata WHERE session_id = $1", session_id
            )
        value = json.loads(text) if text else {}
        return value if isinstance(value, dict) else {}

    @finish_on_cancel
    async def search_threads(
        self, query: ThreadQuery
    ) -> list[tuple[SessionRecord, dict[str, Any]]]:
        """The principal's sessions the query matches, with their metadata, in its order."""
        where = ["s.principal = $1", "NOT s.stateless"]
        params: list[Any] = [query.principal]
        for key, value in query.metadata.items():
            params.append(key)
            params.append(encode_json({"v": value}))
            # equality of one key's value (not containment), as SQLite's search has it
            where.append(
                f"COALESCE(m.metadata, '{{}}'::jsonb) -> ${len(params) - 1}"
                f" = (${len(params)}::jsonb -> 'v')"
            )
        if query.session_ids is not None:
            params.append(list(query.session_ids))
            where.append(f"s.id = ANY(${len(params)}::text[])")
        order = "DESC" if query.descending else "ASC"
        params += [query.limit, query.offset]
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT {_COLUMNS}, m.metadata::text AS thread_metadata FROM sessions s"
                " LEFT JOIN thread_metadata m ON m.session_id = s.id"
                f" WHERE {' AND '.join(where)}"
                f" ORDER BY s.{query.sort_by} {order}, s.id {order}"
                f" LIMIT ${len(params) - 1} OFFSET ${len(params)}",
                *params,
            )
        found = []
        for row in rows:
            metadata = json.loads(row["thread_metadata"]) if row["thread_metadata"] else {}
            found.append(
                (session_record(row, POSTGRES), metadata if isinstance(metadata, dict) else {})
            )
        return found
