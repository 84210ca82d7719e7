"""A stored file as the service sees it, and the shape of its id.

``FileRecord`` is the storage layer's record (``app.storage.files``), named here too so that
the files' users need not reach into the storage layer.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

from app.storage.files import FileRecord

__all__ = ["FILE_ID_PATTERN", "FileRecord", "is_file_id", "new_file_id"]

FILE_ID_PATTERN: Final = r"^file_[0-9a-f]{32}$"
"""``file_`` and 128 random bits in hex."""

_FILE_ID = re.compile(FILE_ID_PATTERN)


def new_file_id() -> str:
    """A new file id: ``file_`` and 128 random bits in hex."""
    return f"file_{secrets.token_hex(16)}"


def is_file_id(value: str) -> bool:
    """Whether ``value`` has the shape of a file id (none other can name a stored file)."""
    return _FILE_ID.match(value) is not None
