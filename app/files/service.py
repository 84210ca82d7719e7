"""The principals' files: upload, read, delete, and the sessions that refer to them.

Every file is owned by the principal who stored it; another principal's file is "not found",
never "forbidden", like a session or a run. Its media type is what its bytes are
(``app.files.checks``), never what the client said. Identical bytes are stored once (by
sha256), whoever uploads them; each upload is a row (``file_id``) of its own. A file a
session's stored messages refer to (``reference``) cannot be deleted until the session is.
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from agent_runtime.content import ContentStore
from app.errors import Conflict, NotFound, PayloadTooLarge
from app.files.checks import check_content
from app.files.content_store import FileContentStore
from app.files.records import FileRecord, is_file_id, new_file_id
from app.files.staging import StagedUpload
from app.storage import FileInUse, FileMissing, SessionNotFound, Store

__all__ = ["FILENAME_MAX_CHARS", "FileService", "clean_filename"]

FILENAME_MAX_CHARS = 255
"""The longest file name kept (a longer one is cut, keeping its extension)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def clean_filename(name: str | None) -> str | None:
    """The name a file is kept under: its last path component, without control characters,
    at most ``FILENAME_MAX_CHARS``; None when nothing is left."""
    if name is None:
        return None
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    kept = "".join(c for c in base if unicodedata.category(c)[0] != "C").strip()
    if kept in ("", ".", ".."):
        return None
    if len(kept) > FILENAME_MAX_CHARS:
        stem, dot, ext = kept.rpartition(".")
        ext = ext if dot and stem and len(ext) <= 16 else ""
        kept = kept[: FILENAME_MAX_CHARS - len(ext) - (1 if ext else 0)] + (
            f".{ext}" if ext else ""
        )
    return kept


class FileService:
    """The files of every principal, in ``store``; files over ``max_bytes`` are refused."""

    def __init__(
        self, store: Store, *, max_bytes: int, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self._store = store
        self.max_bytes = max_bytes
        self._clock = clock

    @property
    def store(self) -> Store:
        """The store the files live in."""
        return self._store

    def staging(self) -> StagedUpload:
        """A new upload in progress, written beside the blobs (see ``put_upload``)."""
        return StagedUpload(self._store.file_staging_dir, limit=self.max_bytes)

    async def put(
        self,
        principal: str,
        data: bytes,
        *,
        filename: str | None = None,
        declared: str | None = None,
    ) -> FileRecord:
        """Store ``data`` as a new file of ``principal``.

        Raises ``PayloadTooLarge`` (over ``max_bytes``), ``UnsupportedMediaType`` (bytes of no
        type taken, or not the ``declared`` one) or ``InvalidRequest`` (``empty_file``,
        ``malformed_file``); nothing is stored then.
        """
        if len(data) > self.max_bytes:
            raise PayloadTooLarge(f"the file is larger than {self.max_bytes} bytes")
        name = clean_filename(filename)
        media_type, sha256 = await asyncio.to_thread(
            check_content, data, limit=self.max_bytes, declared=declared, filename=name
        )
        record = self._record(principal, name, media_type, len(data), sha256)
        await self._store.put_file(record, data)
        return record

    async def put_upload(
        self,
        principal: str,
        upload: StagedUpload,
        *,
        filename: str | None = None,
        declared: str | None = None,
    ) -> FileRecord:
        """Store a finished upload (``staging``) as a new file of ``principal``; refused as
        ``put`` refuses. The upload is taken: stored, or discarded."""
        try:
            name = clean_filename(filename)
            media_type = upload.check.media_type(declared=declared, filename=name)
            record = self._record(
                principal, name, media_type, upload.check.size, upload.check.sha256
            )
            await self._store.put_file(record, upload.take())
        finally:
            await upload.discard()
        return record

    async def get(self, principal: str, file_id: str) -> FileRecord:
        """The principal's file; ``NotFound`` if there is none (or it is another's)."""
        if is_file_id(file_id):
            record = await self._store.get_file(file_id)
            if record is not None and record.principal == principal:
                return record
        raise NotFound(f"no file {file_id!r}")

    async def read(self, principal: str, file_id: str) -> bytes:
        """The bytes of the principal's file; ``NotFound`` as ``get``."""
        record = await self.get(principal, file_id)
        try:
            return await self._store.read_blob(record.sha256)
        except FileMissing:
            raise NotFound(f"no file {file_id!r}") from None  # deleted meanwhile

    async def delete(self, principal: str, file_id: str) -> None:
        """Delete the principal's file; ``NotFound`` as ``get``, ``Conflict`` (code
        ``file_in_use``) while a session's stored messages refer to it."""
        record = await self.get(principal, file_id)
        try:
            deleted = await self._store.delete_file(record.file_id)
        except FileInUse:
            raise Conflict(
                f"file {file_id!r} is referred to by a stored conversation; delete the "
                "session first",
                code="file_in_use",
            ) from None
        if not deleted:
            raise NotFound(f"no file {file_id!r}")

    async def reference(self, file_ids: Collection[str], session_id: str, principal: str) -> None:
        """Record that the session's stored messages refer to these files of ``principal``
        (until the session is deleted); ``NotFound`` for a file that is not the principal's,
        or a session that does not exist (nothing is recorded then)."""
        wanted = sorted(set(file_ids))
        for file_id in wanted:
            await self.get(principal, file_id)
        try:
            await self._store.reference_files(wanted, session_id)
        except FileMissing as exc:
            raise NotFound(str(exc)) from None
        except SessionNotFound:
            raise NotFound(f"no session {session_id!r}") from None

    def content_store(self) -> ContentStore:
        """These files as an ``AgentCore``'s ``content_store`` (``ref`` is a file id)."""
        return FileContentStore(self)

    def _record(
        self, principal: str, filename: str | None, media_type: str, size: int, sha256: str
    ) -> FileRecord:
        return FileRecord(
            file_id=new_file_id(),
            principal=principal,
            filename=filename,
            media_type=media_type,
            bytes=size,
            sha256=sha256,
            created_at=self._clock(),
        )
