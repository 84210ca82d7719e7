"""Thread metadata: a session's own key-value object, searched by equality of its keys.

The LangGraph-compatible API (``app.http.protocols.langgraph``) calls a session a thread and
lets a client tag it (``metadata``) and find it again (``POST /threads/search``). The object
lives beside the session, in a table of its own that goes with it (``ON DELETE CASCADE``).

A search names keys and the values they must hold: a key is 1 to 64 characters of
``A-Z a-z 0-9 _ -`` (it becomes a JSON path in SQLite's query, so nothing else is let in), a
value is any JSON; every named key must hold exactly that value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "METADATA_KEY",
    "THREAD_SORT_COLUMNS",
    "ThreadQuery",
    "check_metadata_filter",
]

METADATA_KEY: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""The keys a metadata search may name."""

THREAD_SORT_COLUMNS: Final = {"created_at": "created_at", "updated_at": "updated_at"}
"""What a search may sort by, and the sessions column each names."""


def check_metadata_filter(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as a search filter; raises ValueError naming the first key refused."""
    for key in metadata:
        if not METADATA_KEY.fullmatch(key):
            raise ValueError(
                f"metadata key {key!r} cannot be searched: use 1 to 64 of A-Z a-z 0-9 _ -"
            )
    return dict(metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadQuery:
    """A search of one principal's listed sessions (stateless ones are never found)."""

    principal: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    session_ids: tuple[str, ...] | None = None
    limit: int = 10
    offset: int = 0
    sort_by: Literal["created_at", "updated_at"] = "updated_at"
    descending: bool = True

    def __post_init__(self) -> None:
        check_metadata_filter(self.metadata)
        if self.limit < 1 or self.offset < 0:
            raise ValueError("limit must be at least 1 and offset at least 0")
