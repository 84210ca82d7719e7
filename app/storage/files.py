"""What the store keeps of uploaded files: their metadata, their bytes, and who refers to them.

Three tables, the same in both backends:

- ``files``: one row per upload (``file_id``), owned by one principal, naming its content by
  sha256. Two uploads of the same bytes are two rows.
- ``file_blobs``: one row per distinct content (sha256). The bytes themselves live beside the
  SQLite database (``files/<sha256[:2]>/<sha256>``) or, in PostgreSQL, in ``file_chunks``
  (1 MiB ``bytea`` pieces), so that every worker of a deployment reads every file. A blob goes
  with the last ``files`` row that names it.
- ``file_refs``: (file_id, session_id): a session's stored messages refer to the file. A file
  with references cannot be deleted (``FileInUse``); the references go with their session.

Dedupe is race-safe: the blob row is inserted with "on conflict do nothing" in the transaction
that inserts the file row, and ``files.sha256`` is a foreign key to it, so a blob deleted by
the removal of its last file while another upload of the same bytes is under way either waits
for that upload (which then keeps it) or is gone before it (and the upload stores it again).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

from app.storage.common import StorageError, require_aware

__all__ = [
    "BLOB_CHUNK_BYTES",
    "FileInUse",
    "FileMissing",
    "FileRecord",
    "FileStore",
    "FileSweep",
]

BLOB_CHUNK_BYTES: Final = 1 << 20
"""The piece size of a blob in PostgreSQL (and of reads and writes of blob files)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FileRecord:
    """One uploaded file: its owner, its name as given, and what its bytes are."""

    file_id: str
    principal: str
    filename: str | None
    media_type: str
    bytes: int
    sha256: str
    created_at: datetime

    def __post_init__(self) -> None:
        require_aware("created_at", self.created_at)

    def to_json(self) -> dict[str, Any]:
        """The file as the API shows it (its owner left out)."""
        return {
            "file_id": self.file_id,
            "filename": self.filename,
            "media_type": self.media_type,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
        }


@dataclass(frozen=True, slots=True)
class FileSweep:
    """What one retention round removed: upload rows, and blobs no row named any more."""

    files: int
    blobs: int


class FileInUse(StorageError):
    """A file that a session's stored messages refer to cannot be deleted."""

    def __init__(self, file_id: str) -> None:
        super().__init__(f"file {file_id!r} is referred to by a stored conversation")
        self.file_id = file_id


class FileMissing(StorageError):
    """A file (or its bytes) that is not stored, or no longer."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not stored")
        self.what = what


class FileStore(Protocol):
    """The file operations of a ``Store`` (see the module docstring for the tables)."""

    @property
    def file_staging_dir(self) -> Path | None:
        """Where an upload in progress is written, so that ``put_file`` can move it into
        place without a copy (the blob directory's own file system); None: the system's
        temporary directory."""
        ...

    async def put_file(self, record: FileRecord, content: bytes | Path) -> None:
        """Store ``record`` and, unless its sha256 is stored already, its bytes: ``content``
        itself, or the file at that path (which this call takes: moved into place or
        removed). One transaction: the row and its blob, or nothing."""
        ...

    async def get_file(self, file_id: str) -> FileRecord | None:
        """The file, or None. The caller checks ``principal``."""
        ...

    async def read_blob(self, sha256: str) -> bytes:
        """The bytes stored under ``sha256``; ``FileMissing`` when there are none."""
        ...

    async def delete_file(self, file_id: str) -> bool:
        """Delete the file's row (and its blob when no other row names it); False if it was
        not stored. ``FileInUse`` (deleting nothing) while a session refers to it."""
        ...

    async def reference_files(self, file_ids: Collection[str], session_id: str) -> None:
        """Record that ``session_id``'s messages refer to these files (repeats are kept once).
        ``FileMissing`` (recording nothing) if one of them is not stored, ``SessionNotFound``
        if the session is not."""
        ...

    async def file_references(self, file_id: str) -> list[str]:
        """The sessions that refer to the file."""
        ...

    async def sweep_files(self, before: datetime, limit: int) -> FileSweep:
        """Delete up to ``limit`` files created before ``before`` that no session refers to,
        then the blobs no row names (left by an interrupted upload)."""
        ...

    async def count_file_blobs(self) -> int:
        """How many distinct contents are stored."""
        ...
