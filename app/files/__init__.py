"""The principals' files: uploads, content sniffing, the store of their bytes, the sessions
that refer to them, and the retention of those no session refers to."""

from __future__ import annotations

from app.files.checks import ACCEPTED_MEDIA_TYPES, ContentCheck, check_content
from app.files.content_store import FileContentStore
from app.files.records import FILE_ID_PATTERN, FileRecord, is_file_id, new_file_id
from app.files.retention import FileRetention
from app.files.service import FileService, clean_filename
from app.files.staging import StagedUpload

__all__ = [
    "ACCEPTED_MEDIA_TYPES",
    "FILE_ID_PATTERN",
    "ContentCheck",
    "FileContentStore",
    "FileRecord",
    "FileRetention",
    "FileService",
    "StagedUpload",
    "check_content",
    "clean_filename",
    "is_file_id",
    "new_file_id",
]
