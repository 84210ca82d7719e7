"""What every part of the storage layer shares: the JSON object of a stored column, aware UTC
times, and ``StorageError``, the root of the error tree drawn in ``app.storage.base``.

The record modules (``base``, ``checkpoints``, ``schedules``) import it; it imports none of
them, so ``base`` can import the records it stores.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["JSONObject", "StorageError", "require_aware", "utcnow"]

JSONObject = dict[str, Any]


class StorageError(Exception):
    """Base of every error the storage layer raises on purpose."""


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime."""
    return datetime.now(UTC)


def require_aware(name: str, value: datetime | None) -> None:
    """Reject naive datetimes: the backends would each guess a different zone."""
    if value is not None and value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
