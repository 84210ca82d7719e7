"""A session's messages in SQLite: the operations on them, each run inside one of the
store's (``app.storage.sqlite.store``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final

from app.storage.base import (
    SessionNotFound,
    StaleFence,
    StoredMessage,
    encode_json,
    message_role,
    utcnow,
)
from app.storage.rows import SQLITE, stored_message
from app.storage.sqlite.timestamps import ts

__all__ = [
    "SHORT_CHARACTERS",
    "SHORT_MESSAGES",
    "delete_last_turn",
    "insert_messages",
    "select_messages",
    "select_short_conversation",
]

SHORT_MESSAGES: Final = 64
"""Messages of a conversation at most for it to be read on the loop's connection."""
SHORT_CHARACTERS: Final = 256 * 1024
"""Characters of a conversation's messages at most for the same."""

_COLUMNS: Final = "session_id, run_id, position, role, message, created_at"


def delete_last_turn(db: sqlite3.Connection, session_id: str, run_id: str) -> bool:
    """Delete the run's messages if they end the conversation (``Store.remove_last_turn``)."""
    first = db.execute(
        "SELECT MIN(position) FROM messages WHERE session_id = ? AND run_id = ?",
        (session_id, run_id),
    ).fetchone()[0]
    if first is None:
        return True  # the run stored nothing
    later = db.execute(
        "SELECT 1 FROM messages WHERE session_id = ? AND position > ? AND run_id != ? LIMIT 1",
        (session_id, first, run_id),
    ).fetchone()
    if later is not None:
        return False
    removed = db.execute(
        "DELETE FROM messages WHERE session_id = ? AND run_id = ?", (session_id, run_id)
    ).rowcount
    if removed:
        db.execute(
            "UPDATE sessions SET message_count = message_count - ?, updated_at = ?,"
            " last_run_id = (SELECT run_id FROM messages WHERE session_id = ?"
            " ORDER BY position DESC LIMIT 1) WHERE id = ?",
            (removed, ts(utcnow()), session_id, session_id),
        )
    return True


def select_short_conversation(
    db: sqlite3.Connection, session_id: str
) -> list[StoredMessage] | None:
    """The conversation if it is short (what decoding it holds the loop for is bounded: at
    most ``SHORT_MESSAGES`` messages and ``SHORT_CHARACTERS`` characters), else None."""
    count, characters = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(LENGTH(message)), 0) FROM"
        " (SELECT message FROM messages WHERE session_id = ? LIMIT ?)",
        (session_id, SHORT_MESSAGES + 1),
    ).fetchone()
    if count > SHORT_MESSAGES or characters > SHORT_CHARACTERS:
        return None
    return select_messages(db, session_id)


def select_messages(db: sqlite3.Connection, session_id: str) -> list[StoredMessage]:
    """The conversation in order."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM messages WHERE session_id = ? ORDER BY position",
        (session_id,),
    ).fetchall()
    return [stored_message(row, SQLITE) for row in rows]


def insert_messages(
    db: sqlite3.Connection,
    session_id: str,
    run_id: str,
    messages: Sequence[Mapping[str, Any]],
    fence: int | None,
) -> None:
    """Append one run's messages after the session's last (``Store.append_messages``)."""
    # the write transaction is exclusive: what is read here stays true until it commits
    row = db.execute(
        "SELECT message_count, fence, (SELECT fence FROM runs WHERE run_id = ?) AS run_fence"
        " FROM sessions WHERE id = ?",
        (run_id, session_id),
    ).fetchone()
    if row is None:
        raise SessionNotFound(session_id)
    if fence is not None:
        stored = max(row["fence"], row["run_fence"] or 0)
        if stored > fence:
            raise StaleFence(f"session {session_id!r}", fence, stored)
    start: int = row["message_count"]
    now = ts(utcnow())
    db.execute(
        "UPDATE sessions SET message_count = message_count + ?, last_run_id = ?,"
        " updated_at = ?, fence = MAX(fence, COALESCE(?, 0)) WHERE id = ?",
        (len(messages), run_id, now, fence, session_id),
    )
    # Encoding happens inside the transaction: a bad message rolls back the session update
    # above along with any rows, leaving nothing half-written.
    rows = [
        (session_id, run_id, start + i, message_role(i, m), encode_json(m), now)
        for i, m in enumerate(messages)
    ]
    db.executemany(f"INSERT INTO messages ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", rows)
