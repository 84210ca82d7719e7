"""The service's files as an agent's ``ContentStore``: a message's media ``ref`` is a file id.

``put`` stores bytes a run made (a tool's image, a data URL) as a file of the run's session's
principal, referred to by that session; ``get`` reads a file by id. Ownership is checked where
a client names a file (the run's input), not here: the runtime only ever asks for the refs
its own messages hold.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from agent_runtime.content import ContentError, StoredContent
from app.errors import ServiceError
from app.files.records import FileRecord, is_file_id
from app.storage import FileMissing, Store

__all__ = ["FileContentStore"]


class _Files(Protocol):
    """What the content store needs of ``FileService``."""

    @property
    def store(self) -> Store: ...

    async def put(
        self,
        principal: str,
        data: bytes,
        *,
        filename: str | None = None,
        declared: str | None = None,
    ) -> FileRecord: ...

    async def reference(
        self, file_ids: Collection[str], session_id: str, principal: str
    ) -> None: ...


class FileContentStore:
    """A ``ContentStore`` over the service's files (``FileService.content_store()``)."""

    def __init__(self, files: _Files) -> None:
        self._files = files

    async def put(
        self, data: bytes, media_type: str, *, session_id: str | None = None
    ) -> StoredContent:
        """Store ``data`` as a file of ``session_id``'s principal, referred to by the session.

        Raises ``ContentError`` without a session, and for bytes the files refuse (not
        ``media_type``, of no type taken, too large).
        """
        if session_id is None:
            raise ContentError("content is stored as a file of a session's owner: name the session")
        session = await self._files.store.get_session(session_id)
        if session is None:
            raise ContentError(f"no session {session_id!r} to store content for")
        try:
            record = await self._files.put(session.principal, data, declared=media_type)
            await self._files.reference([record.file_id], session_id, session.principal)
        except ServiceError as exc:
            raise ContentError(exc.detail) from exc
        return StoredContent(record.file_id, record.media_type, record.bytes, record.sha256)

    async def get(self, ref: str) -> bytes:
        """The bytes of the file ``ref``; ``ContentError`` when it is not stored."""
        record = await self._files.store.get_file(ref) if is_file_id(ref) else None
        if record is None:
            raise ContentError(f"no stored file {ref!r}")
        try:
            return await self._files.store.read_blob(record.sha256)
        except FileMissing:
            raise ContentError(f"no stored file {ref!r}") from None
