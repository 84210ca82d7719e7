"""An upload in progress: its bytes written to a temporary file and checked as they arrive.

Pieces are gathered into writes of about 1 MiB, each written, hashed and decoded on a worker
thread (``ContentCheck``), so the event loop only counts bytes: a 20 MiB upload costs it a
few dozen hand-offs, and memory holds at most one gathered write, never the whole file. The
limit is enforced as bytes arrive: past it, ``write`` raises ``PayloadTooLarge`` before
anything more is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Final

from app.errors import PayloadTooLarge
from app.files.checks import ContentCheck
from app.storage.files import BLOB_CHUNK_BYTES

__all__ = ["StagedUpload"]

_GATHER: Final = BLOB_CHUNK_BYTES


class StagedUpload:
    """One upload being written to a temporary file in ``directory`` (None: the system's).

    Use ``write`` for each piece, ``finish`` at the end, then hand it to
    ``FileService.put_upload``; ``discard`` (idempotent) removes what is left.
    """

    def __init__(self, directory: Path | None, *, limit: int) -> None:
        self.check = ContentCheck(limit)
        self._directory = directory
        self._handle: BinaryIO | None = None
        self._path: Path | None = None
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._received = 0
        self._taken = False

    @property
    def received(self) -> int:
        """Bytes received so far (written or gathered)."""
        return self._received

    async def write(self, piece: bytes) -> None:
        """Take the next bytes of the file."""
        if not piece:
            return
        self._received += len(piece)
        if self._received > self.check.limit:
            raise PayloadTooLarge(f"the file is larger than {self.check.limit} bytes")
        self._pending.append(piece)
        self._pending_size += len(piece)
        if self._pending_size >= _GATHER:
            await self._flush()

    async def finish(self) -> None:
        """Write what is gathered and close the file (its durability is the store's: only
        bytes not stored yet need an fsync)."""
        await self._flush()
        if self._handle is None:
            await asyncio.to_thread(self._open)
        handle = self._handle
        assert handle is not None
        await asyncio.to_thread(handle.close)
        self._handle = None

    def take(self) -> Path:
        """The finished file's path, handed over to its new owner (``discard`` leaves it)."""
        if self._path is None or self._handle is not None:
            raise RuntimeError("finish() the upload before taking it")
        self._taken = True
        return self._path

    async def discard(self) -> None:
        """Close and remove the temporary file, unless it was taken."""
        handle, self._handle = self._handle, None
        path = self._path
        self._pending.clear()
        if handle is not None:
            await asyncio.to_thread(handle.close)
        if path is not None and not self._taken:
            await asyncio.to_thread(_unlink, path)

    async def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        await asyncio.to_thread(self._write, data)

    def _open(self) -> None:
        if self._directory is not None:
            self._directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(
            prefix="upload-",
            suffix=".part",
            dir=None if self._directory is None else self._directory,
        )
        self._handle = os.fdopen(fd, "wb")
        self._path = Path(name)

    def _write(self, data: bytes) -> None:
        if self._handle is None:
            self._open()
        assert self._handle is not None
        self.check.feed(data)
        self._handle.write(data)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
