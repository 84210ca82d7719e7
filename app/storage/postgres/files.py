"""Files in PostgreSQL: metadata and bytes in the database, so every worker reads every file.

A blob's bytes are ``file_chunks`` rows of at most 1 MiB (``BLOB_CHUNK_BYTES``), written in the
transaction that inserts the blob's row and its first file row: an upload streams to the
server a piece at a time, never one 20 MiB parameter (which asyncpg would copy once more into
its buffer). Why PostgreSQL rather than an object store: see docs/deploy.md ("Files").

Races (see ``app.storage.files``): the blob row is inserted with ``ON CONFLICT DO NOTHING``,
which waits for a concurrent insert of the same sha256 to commit or roll back; ``files.sha256``
references the blob, so a file row can never name a deleted blob (an upload that lost that race
gets a foreign key violation and starts again), and a blob's delete (``NOT EXISTS`` a file that
names it) fails on the same key when an upload's row landed meanwhile, which keeps the blob.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Final

import asyncpg

from app.storage.base import BackgroundOperations, SessionNotFound, finish_on_cancel
from app.storage.files import BLOB_CHUNK_BYTES, FileInUse, FileMissing, FileRecord, FileSweep

__all__ = ["FILES_MIGRATION", "PostgresFiles"]

# The schema of files (migration 13 in the project's numbering).
FILES_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS file_blobs (
        sha256 text PRIMARY KEY,
        bytes bigint NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS file_chunks (
        sha256 text NOT NULL REFERENCES file_blobs (sha256) ON DELETE CASCADE,
        seq integer NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (sha256, seq)
    )""",
    # bytes that are already compressed (images, PDFs) gain nothing from TOAST's compression
    "ALTER TABLE file_chunks ALTER COLUMN data SET STORAGE EXTERNAL",
    """CREATE TABLE IF NOT EXISTS files (
        file_id text PRIMARY KEY,
        principal text NOT NULL,
        filename text,
        media_type text NOT NULL,
        bytes bigint NOT NULL,
        sha256 text NOT NULL REFERENCES file_blobs (sha256),
        created_at timestamptz NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS files_by_sha256 ON files (sha256)",
    "CREATE INDEX IF NOT EXISTS files_by_created ON files (created_at)",
    """CREATE TABLE IF NOT EXISTS file_refs (
        file_id text NOT NULL REFERENCES files (file_id),
        session_id text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        PRIMARY KEY (file_id, session_id)
    )""",
    "CREATE INDEX IF NOT EXISTS file_refs_by_session ON file_refs (session_id)",
)

_COLUMNS: Final = "file_id, principal, filename, media_type, bytes, sha256, created_at"
# an upload that keeps losing the race against deletes of its blob gives up after this many
_PUT_ATTEMPTS: Final = 5


def _record(row: Any) -> FileRecord:
    return FileRecord(
        file_id=row["file_id"],
        principal=row["principal"],
        filename=row["filename"],
        media_type=row["media_type"],
        bytes=int(row["bytes"]),
        sha256=row["sha256"],
        created_at=row["created_at"],
    )


class PostgresFiles(BackgroundOperations):
    """The file operations of ``PostgresStore`` (which provides ``_connection``)."""

    def _connection(  # pragma: no cover - overridden by PostgresStore
        self,
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    @property
    def file_staging_dir(self) -> Path | None:
        """Uploads in progress go to the system's temporary directory."""
        return None

    @finish_on_cancel
    async def put_file(self, record: FileRecord, content: bytes | Path) -> None:
        """Store the file, and its bytes unless stored already; see ``FileStore.put_file``."""
        try:
            for attempt in range(_PUT_ATTEMPTS):
                try:
                    await self._put(record, content)
                    return
                except asyncpg.ForeignKeyViolationError:
                    # the blob was deleted between its insert (a conflict: there) and the file
                    # row's: store it again
                    if attempt == _PUT_ATTEMPTS - 1:
                        raise
        finally:
            if isinstance(content, Path):
                await asyncio.to_thread(content.unlink, True)

    async def _put(self, record: FileRecord, content: bytes | Path) -> None:
        async with self._connection() as conn, conn.transaction():
            new_blob = await conn.fetchval(
                "INSERT INTO file_blobs (sha256, bytes) VALUES ($1, $2)"
                " ON CONFLICT (sha256) DO NOTHING RETURNING true",
                record.sha256,
                record.bytes,
            )
            if new_blob:
                seq = 0
                async for piece in _pieces(content):
                    await conn.execute(
                        "INSERT INTO file_chunks (sha256, seq, data) VALUES ($1, $2, $3)",
                        record.sha256,
                        seq,
                        piece,
                    )
                    seq += 1
            await conn.execute(
                f"INSERT INTO files ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                record.file_id,
                record.principal,
                record.filename,
                record.media_type,
                record.bytes,
                record.sha256,
                record.created_at,
            )

    @finish_on_cancel
    async def get_file(self, file_id: str) -> FileRecord | None:
        """The file, or None."""
        async with self._connection() as conn:
            row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM files WHERE file_id = $1", file_id)
        return None if row is None else _record(row)

    @finish_on_cancel
    async def read_blob(self, sha256: str) -> bytes:
        """The bytes of ``sha256``: its pieces, in one statement (one snapshot)."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                "SELECT b.bytes, c.data FROM file_blobs b"
                " LEFT JOIN file_chunks c ON c.sha256 = b.sha256"
                " WHERE b.sha256 = $1 ORDER BY c.seq",
                sha256,
            )
        if not rows:
            raise FileMissing(f"the content {sha256}")
        data = b"".join(row["data"] for row in rows if row["data"] is not None)
        if len(data) != rows[0]["bytes"]:  # pragma: no cover - only if someone edits the rows
            raise FileMissing(f"the whole content {sha256}")
        return data

    @finish_on_cancel
    async def delete_file(self, file_id: str) -> bool:
        """Delete the file, and its blob with its last row; ``FileInUse`` while referred to."""
        async with self._connection() as conn, conn.transaction():
            try:
                sha256 = await conn.fetchval(
                    "DELETE FROM files WHERE file_id = $1 RETURNING sha256", file_id
                )
            except asyncpg.ForeignKeyViolationError:
                raise FileInUse(file_id) from None
            if sha256 is None:
                return False
            await _drop_blob_if_unnamed(conn, sha256)
        return True

    @finish_on_cancel
    async def reference_files(self, file_ids: Collection[str], session_id: str) -> None:
        """Record that the session refers to these files; see ``FileStore.reference_files``."""
        wanted = sorted(set(file_ids))
        if not wanted:
            return
        async with self._connection() as conn, conn.transaction():
            # the session's row and the files' rows locked: neither goes before the insert
            if not await conn.fetchval(
                "SELECT true FROM sessions WHERE id = $1 FOR KEY SHARE", session_id
            ):
                raise SessionNotFound(session_id)
            found = {
                row["file_id"]
                for row in await conn.fetch(
                    "SELECT file_id FROM files WHERE file_id = ANY($1::text[]) FOR KEY SHARE",
                    wanted,
                )
            }
            missing = [file_id for file_id in wanted if file_id not in found]
            if missing:
                raise FileMissing(f"file {missing[0]!r}")
            await conn.execute(
                "INSERT INTO file_refs (file_id, session_id)"
                " SELECT unnest($1::text[]), $2 ON CONFLICT DO NOTHING",
                wanted,
                session_id,
            )

    @finish_on_cancel
    async def file_references(self, file_id: str) -> list[str]:
        """The sessions that refer to the file."""
        async with self._connection() as conn:
            rows = await conn.fetch(
                "SELECT session_id FROM file_refs WHERE file_id = $1 ORDER BY session_id",
                file_id,
            )
        return [row["session_id"] for row in rows]

    @finish_on_cancel
    async def sweep_files(self, before: datetime, limit: int) -> FileSweep:
        """Delete unreferenced files created before ``before``, then unnamed blobs."""
        async with self._connection() as conn, conn.transaction():
            # SKIP LOCKED: workers sweeping at once take different rows; a row a reference is
            # being added to (locked) waits for the next round
            rows = await conn.fetch(
                "DELETE FROM files WHERE file_id IN (SELECT file_id FROM files"
                " WHERE created_at < $1 AND NOT EXISTS (SELECT 1 FROM file_refs r"
                " WHERE r.file_id = files.file_id)"
                " ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING sha256",
                before,
                limit,
            )
            blobs = 0
            for sha256 in sorted({row["sha256"] for row in rows}):
                blobs += await _drop_blob_if_unnamed(conn, sha256)
        # blobs without rows (a transaction holds both or neither; only an edit leaves one)
        async with self._connection() as conn, conn.transaction():
            orphans = await conn.fetch(
                "SELECT sha256 FROM file_blobs b WHERE NOT EXISTS"
                " (SELECT 1 FROM files f WHERE f.sha256 = b.sha256) LIMIT $1",
                limit,
            )
            for row in orphans:
                blobs += await _drop_blob_if_unnamed(conn, row["sha256"])
        return FileSweep(files=len(rows), blobs=blobs)

    @finish_on_cancel
    async def count_file_blobs(self) -> int:
        """How many distinct contents are stored."""
        async with self._connection() as conn:
            count = await conn.fetchval("SELECT count(*) FROM file_blobs")
        return int(count)


async def _drop_blob_if_unnamed(conn: Any, sha256: str) -> int:
    """Delete the blob of ``sha256`` (its pieces cascade) if no file names it; 1 if deleted.

    In a savepoint: an upload's file row that landed meanwhile makes the delete fail on the
    foreign key, which means the blob stays.
    """
    try:
        async with conn.transaction():
            deleted = await conn.fetchval(
                "DELETE FROM file_blobs b WHERE sha256 = $1 AND NOT EXISTS"
                " (SELECT 1 FROM files f WHERE f.sha256 = $1) RETURNING true",
                sha256,
            )
    except asyncpg.ForeignKeyViolationError:
        return 0
    return 1 if deleted else 0


async def _pieces(content: bytes | Path) -> AsyncIterator[bytes]:
    """``content`` in pieces of ``BLOB_CHUNK_BYTES``, a file's read off the loop."""
    if isinstance(content, bytes):
        view = memoryview(content)
        for start in range(0, len(content), BLOB_CHUNK_BYTES):
            yield bytes(view[start : start + BLOB_CHUNK_BYTES])
        return
    handle: BinaryIO = await asyncio.to_thread(open, content, "rb")
    try:
        while piece := await asyncio.to_thread(handle.read, BLOB_CHUNK_BYTES):
            yield piece
    finally:
        await asyncio.to_thread(handle.close)
