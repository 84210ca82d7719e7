"""How the SQLite store writes a time: fixed-width UTC text, which sorts in time order (so
``ORDER BY created_at`` works on a TEXT column)."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["optional_ts", "ts"]


def ts(value: datetime) -> str:
    """``value`` as the store writes it (an aware datetime)."""
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def optional_ts(value: datetime | None) -> str | None:
    """``ts(value)``, None for None."""
    return None if value is None else ts(value)
