"""Files in SQLite: metadata in the database, bytes in files beside it.

A blob is ``<dir>/files/<sha256[:2]>/<sha256>`` next to the database file (a database in
memory keeps its blobs in a temporary directory of its own). It is written to
``files/.staging`` first (and fsync'd there, off the store's thread, unless its content is
stored already: an upload of known bytes costs no fsync), then renamed into place inside the
transaction that inserts its row: the store's write lock (``BEGIN IMMEDIATE``,
which every process sharing the file takes) orders every rename and unlink of a blob with the
rows that name it, so no reader finds a row without its bytes. A blob whose last row goes is
moved aside in the same transaction and unlinked once it committed (moved back if it did not).
What a crash leaves (a staged upload, a blob moved into place whose transaction never
committed) the retention sweep removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sqlite3
import tempfile
import time
import weakref
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from app.storage.base import (
    BackgroundOperations,
    SessionNotFound,
    finish_on_cancel,
    utcnow,
)
from app.storage.files import FileInUse, FileMissing, FileRecord, FileSweep
from app.storage.sqlite.timestamps import ts

__all__ = ["FILES_MIGRATION", "SQLiteFiles", "blob_root_of"]

# The schema of files (migration 13 in the project's numbering).
FILES_MIGRATION: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS file_blobs (
        sha256 TEXT PRIMARY KEY,
        bytes INTEGER NOT NULL,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS files (
        file_id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        filename TEXT,
        media_type TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        sha256 TEXT NOT NULL REFERENCES file_blobs (sha256),
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS files_by_sha256 ON files (sha256)",
    "CREATE INDEX IF NOT EXISTS files_by_created ON files (created_at)",
    """CREATE TABLE IF NOT EXISTS file_refs (
        file_id TEXT NOT NULL REFERENCES files (file_id),
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        PRIMARY KEY (file_id, session_id)
    )""",
    "CREATE INDEX IF NOT EXISTS file_refs_by_session ON file_refs (session_id)",
)

_COLUMNS: Final = "file_id, principal, filename, media_type, bytes, sha256, created_at"
_STAGING: Final = ".staging"
# a staged upload older than this belongs to no upload in progress any more
_STALE_STAGED_SECONDS: Final = 3600.0


def blob_root_of(database: str) -> Path:
    """Where the blobs of the SQLite database at ``database`` live: ``files`` beside it."""
    return Path(database).parent / "files"


def _record(row: sqlite3.Row) -> FileRecord:
    return FileRecord(
        file_id=row["file_id"],
        principal=row["principal"],
        filename=row["filename"],
        media_type=row["media_type"],
        bytes=int(row["bytes"]),
        sha256=row["sha256"],
        created_at=datetime.fromisoformat(row["created_at"]),
    )


class SQLiteFiles(BackgroundOperations):
    """The file operations of ``SQLiteStore`` (which provides ``_path``, ``_read`` and
    ``_write``)."""

    _path: str
    _blob_dir: Path | None = None

    async def _read(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _write(self, function: Any, *args: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def blob_root(self) -> Path:
        """The directory of this database's blobs."""
        if self._blob_dir is None:
            if self._path == ":memory:":
                made = Path(tempfile.mkdtemp(prefix="agent-files-"))
                weakref.finalize(self, shutil.rmtree, made, True)
                self._blob_dir = made
            else:
                self._blob_dir = blob_root_of(self._path)
        return self._blob_dir

    @property
    def file_staging_dir(self) -> Path:
        """Uploads in progress: on the blobs' own file system, so a rename moves them."""
        return self.blob_root / _STAGING

    @finish_on_cancel
    async def put_file(self, record: FileRecord, content: bytes | Path) -> None:
        """Store the file, and its bytes unless stored already; see ``FileStore.put_file``."""
        staged, synced = await asyncio.to_thread(
            _stage, self.file_staging_dir, content, _blob_path(self.blob_root, record.sha256)
        )
        try:
            await self._write(_put, record, staged, synced, self.blob_root)
        finally:
            await asyncio.to_thread(_unlink, staged)  # gone already once moved into place

    async def get_file(self, file_id: str) -> FileRecord | None:
        """The file, or None."""
        found: FileRecord | None = await self._read(_get, file_id)
        return found

    async def read_blob(self, sha256: str) -> bytes:
        """The bytes of ``sha256``, read off the loop (and off the store's thread)."""
        return await asyncio.to_thread(_read_blob, self.blob_root, sha256)

    @finish_on_cancel
    async def delete_file(self, file_id: str) -> bool:
        """Delete the file, and its blob with its last row; ``FileInUse`` while referred to."""
        trash = self.file_staging_dir / f"{secrets.token_hex(8)}.deleted"
        try:
            deleted: bool = await self._write(_delete, file_id, self.blob_root, trash)
        except BaseException:
            await asyncio.to_thread(_restore, trash)  # the transaction did not commit
            raise
        await asyncio.to_thread(_discard, trash)
        return deleted

    async def reference_files(self, file_ids: Collection[str], session_id: str) -> None:
        """Record that the session refers to these files; see ``FileStore.reference_files``."""
        if file_ids:
            await self._write(_reference, sorted(set(file_ids)), session_id)

    async def file_references(self, file_id: str) -> list[str]:
        """The sessions that refer to the file."""
        found: list[str] = await self._read(_references, file_id)
        return found

    @finish_on_cancel
    async def sweep_files(self, before: datetime, limit: int) -> FileSweep:
        """Delete unreferenced files created before ``before``, then unnamed blobs."""
        trash = self.file_staging_dir / f"{secrets.token_hex(8)}.swept"
        # the blob files are listed outside the write lock; only the few without a row are
        # looked at again under it (an upload's rename and its row commit together)
        unnamed = await asyncio.to_thread(_survey, self.blob_root)
        try:
            swept: FileSweep = await self._write(
                _sweep, ts(before), limit, self.blob_root, trash, unnamed
            )
        except BaseException:
            await asyncio.to_thread(_restore_all, trash)
            raise
        await asyncio.to_thread(shutil.rmtree, trash, True)
        return swept

    async def count_file_blobs(self) -> int:
        """How many distinct contents are stored."""
        count: int = await self._read(_count_blobs)
        return count


# --- on a worker thread (not the store's) ------------------------------------------------------


def _stage(staging: Path, content: bytes | Path, final: Path) -> tuple[Path, bool]:
    """``content`` as a staged file in ``staging``: moved there (a path) or written (bytes);
    fsync'd unless ``final`` (its blob) exists already. The file, and whether it was synced."""
    staging.mkdir(parents=True, exist_ok=True)
    target = staging / f"{secrets.token_hex(16)}.upload"
    if isinstance(content, Path):
        try:
            os.replace(content, target)
        except OSError:
            # another file system: copy, then drop the original
            shutil.copyfile(content, target)
            _unlink(content)
    else:
        target.write_bytes(content)
    if final.exists():
        return target, False  # most likely deduplicated: _put syncs it if not after all
    _fsync_file(target)
    return target, True


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _read_blob(root: Path, sha256: str) -> bytes:
    try:
        return _blob_path(root, sha256).read_bytes()
    except FileNotFoundError:
        raise FileMissing(f"the content {sha256}") from None


def _unlink(path: Path) -> bool:
    """Unlink ``path``; whether it was there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _discard(trash: Path) -> None:
    """Unlink a blob moved aside by a delete that committed, and its note."""
    _unlink(trash)
    _unlink(trash.with_suffix(".from"))


def _restore(trash: Path) -> None:
    """Put back a blob moved aside by a delete that did not commit."""
    marker = trash.with_suffix(".from")
    with contextlib.suppress(FileNotFoundError):
        origin = Path(marker.read_text())
        os.replace(trash, origin)
        marker.unlink()


def _restore_all(trash: Path) -> None:
    """Put back the blobs moved aside by a sweep that did not commit."""
    if not trash.is_dir():
        return
    for moved in trash.iterdir():
        if moved.suffix != ".from":
            with contextlib.suppress(FileNotFoundError):
                os.replace(moved, Path((moved.with_suffix(".from")).read_text()))
    shutil.rmtree(trash, ignore_errors=True)


def _blob_path(root: Path, sha256: str) -> Path:
    return root / sha256[:2] / sha256


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- on the store's thread, in its transactions -----------------------------------------------


def _put(
    db: sqlite3.Connection, record: FileRecord, staged: Path, synced: bool, root: Path
) -> None:
    new_blob = db.execute(
        "INSERT OR IGNORE INTO file_blobs (sha256, bytes, created_at) VALUES (?, ?, ?)",
        (record.sha256, record.bytes, ts(utcnow())),
    ).rowcount
    final = _blob_path(root, record.sha256)
    moved = False
    if new_blob or not final.exists():
        if not synced:  # its blob went since _stage looked: rare, and worth the wait
            _fsync_file(staged)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, final)
        _fsync_dir(final.parent)
        moved = True
    try:
        db.execute(
            f"INSERT INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                record.file_id,
                record.principal,
                record.filename,
                record.media_type,
                record.bytes,
                record.sha256,
                ts(record.created_at),
            ),
        )
    except BaseException:
        if moved and new_blob:
            _unlink(final)  # rolled back with its row
        raise


def _get(db: sqlite3.Connection, file_id: str) -> FileRecord | None:
    row = db.execute(f"SELECT {_COLUMNS} FROM files WHERE file_id = ?", (file_id,)).fetchone()
    return None if row is None else _record(row)


def _delete(db: sqlite3.Connection, file_id: str, root: Path, trash: Path) -> bool:
    row = db.execute("SELECT sha256 FROM files WHERE file_id = ?", (file_id,)).fetchone()
    if row is None:
        return False
    if db.execute("SELECT 1 FROM file_refs WHERE file_id = ? LIMIT 1", (file_id,)).fetchone():
        raise FileInUse(file_id)
    db.execute("DELETE FROM files WHERE file_id = ?", (file_id,))
    _drop_blob_if_unnamed(db, row["sha256"], root, trash)
    return True


def _drop_blob_if_unnamed(db: sqlite3.Connection, sha256: str, root: Path, trash: Path) -> bool:
    """Delete the blob row of ``sha256`` if no file names it, moving its bytes to ``trash``
    (with a note of where they were, for a rollback to put them back); whether it did."""
    dropped = db.execute(
        "DELETE FROM file_blobs WHERE sha256 = ?"
        " AND NOT EXISTS (SELECT 1 FROM files WHERE sha256 = ?)",
        (sha256, sha256),
    ).rowcount
    if not dropped:
        return False
    final = _blob_path(root, sha256)
    trash.parent.mkdir(parents=True, exist_ok=True)
    trash.with_suffix(".from").write_text(str(final))
    with contextlib.suppress(FileNotFoundError):
        os.replace(final, trash)
    return True


def _reference(db: sqlite3.Connection, file_ids: list[str], session_id: str) -> None:
    if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFound(session_id)
    marks = ", ".join("?" * len(file_ids))
    found = {
        row[0]
        for row in db.execute(f"SELECT file_id FROM files WHERE file_id IN ({marks})", file_ids)
    }
    missing = [file_id for file_id in file_ids if file_id not in found]
    if missing:
        raise FileMissing(f"file {missing[0]!r}")
    db.executemany(
        "INSERT OR IGNORE INTO file_refs (file_id, session_id) VALUES (?, ?)",
        [(file_id, session_id) for file_id in file_ids],
    )


def _references(db: sqlite3.Connection, file_id: str) -> list[str]:
    rows = db.execute(
        "SELECT session_id FROM file_refs WHERE file_id = ? ORDER BY session_id", (file_id,)
    ).fetchall()
    return [row[0] for row in rows]


def _count_blobs(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM file_blobs").fetchone()[0])


def _sweep(
    db: sqlite3.Connection,
    before: str,
    limit: int,
    root: Path,
    trash: Path,
    candidates: list[str],
) -> FileSweep:
    rows = db.execute(
        "SELECT file_id, sha256 FROM files WHERE created_at < ?"
        " AND NOT EXISTS (SELECT 1 FROM file_refs WHERE file_refs.file_id = files.file_id)"
        " ORDER BY created_at LIMIT ?",
        (before, limit),
    ).fetchall()
    for row in rows:
        db.execute("DELETE FROM files WHERE file_id = ?", (row["file_id"],))
    blobs = sum(
        _drop_blob_if_unnamed(db, sha256, root, trash / sha256)
        for sha256 in {row["sha256"] for row in rows}
    )
    # blob files without a row: what an upload whose transaction did not commit left
    for start in range(0, len(candidates), 500):
        batch = candidates[start : start + 500]
        marks = ", ".join("?" * len(batch))
        named = {
            row[0]
            for row in db.execute(f"SELECT sha256 FROM file_blobs WHERE sha256 IN ({marks})", batch)
        }
        for sha256 in batch:
            # (one dropped above was moved aside already)
            if sha256 not in named and _unlink(_blob_path(root, sha256)):
                blobs += 1
    return FileSweep(files=len(rows), blobs=blobs)


def _survey(root: Path) -> list[str]:
    """The names of the blob files under ``root``; stale staged uploads are removed on the
    way (an upload in progress writes its staged file within the hour)."""
    if not root.is_dir():
        return []
    names: list[str] = []
    for shard in root.iterdir():
        if shard.name != _STAGING and shard.is_dir():
            names.extend(blob.name for blob in shard.iterdir())
    staging = root / _STAGING
    if staging.is_dir():
        stale = time.time() - _STALE_STAGED_SECONDS
        for staged in staging.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if staged.is_file() and staged.stat().st_mtime < stale:
                    staged.unlink()
    return names
