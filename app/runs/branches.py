"""Branches of a session's conversation: a run may continue from an earlier turn (a fork).

A session's stored messages are its turns in the order they were stored (one turn per run).
Each turn continues the turn stored before it, unless its first message names another
(``"parent_run": <run id>``, written by a run started with ``branch_from``): then it
continues that one, and the turns after that one are another branch, still stored and
readable, which the model of this branch never sees.

The conversation a run continues is the path from the first turn to its head: the turn it
branches from, or the session's latest turn. A session that never forked has one path, all
its turns, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from app.storage import StoredMessage

__all__ = ["PARENT_KEY", "Turn", "branch_path", "mark_branch", "parents", "turns_of"]

PARENT_KEY: Final = "parent_run"
"""The key of a turn's first stored message that names the turn it continues."""


@dataclass(slots=True)
class Turn:
    """One run's stored messages."""

    run_id: str
    messages: list[StoredMessage] = field(default_factory=list)


def turns_of(stored: Sequence[StoredMessage]) -> list[Turn]:
    """The stored messages grouped into turns, in stored order."""
    turns: list[Turn] = []
    for item in stored:
        if not turns or turns[-1].run_id != item.run_id:
            turns.append(Turn(item.run_id))
        turns[-1].messages.append(item)
    return turns


def parents(turns: Sequence[Turn]) -> dict[str, str | None]:
    """Each turn's parent: the turn its first message names, else the turn before it."""
    known = {t.run_id for t in turns}
    found: dict[str, str | None] = {}
    previous: str | None = None
    for turn in turns:
        named = turn.messages[0].message.get(PARENT_KEY) if turn.messages else None
        found[turn.run_id] = named if isinstance(named, str) and named in known else previous
        previous = turn.run_id
    return found


def branch_path(turns: Sequence[Turn], head: str | None = None) -> list[Turn]:
    """The turns from the first to ``head`` (default: the latest turn), following parents."""
    if not turns:
        return []
    by_id = {t.run_id: t for t in turns}
    up = parents(turns)
    current: str | None = head if head in by_id else turns[-1].run_id
    path: list[Turn] = []
    seen: set[str] = set()
    while current is not None and current not in seen:  # a cycle cannot be stored, but
        seen.add(current)  # a hand-edited database must not hang a run
        path.append(by_id[current])
        current = up[current]
    path.reverse()
    return path


def mark_branch(turn: list[dict[str, Any]], branch_from: str | None) -> list[dict[str, Any]]:
    """``turn`` (stored form) with its first message naming ``branch_from``, when given."""
    if branch_from is not None and turn:
        turn[0] = {**turn[0], PARENT_KEY: branch_from}
    return turn
