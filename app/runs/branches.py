"""Branches of a session's conversation: a run may continue from an earlier turn (a fork).

A session's stored messages are its turns in the order they were stored (one turn per run).
Each turn continues the turn stored before it, unless its first message names another
(``"parent_run": <run id>``, written by a run started with ``branch_from``): then it
continues that one, and the turns after that one are another branch, still stored and
readable, which the model of this branch never sees. A first message naming none
(``"parent_run": null``, written by a run started with ``branch_from`` ``START``) makes a new
first turn: a branch from the start of the conversation, beside the first turn.

The conversation a run continues is the path from the first turn to its head: the turn it
branches from, or the session's latest turn. A session that never forked has one path, all
its turns, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from app.errors import InvalidRequest, NotFound
from app.storage import Store, StoredMessage

__all__ = [
    "PARENT_KEY",
    "START",
    "Turn",
    "branch_path",
    "check_branch_from",
    "mark_branch",
    "parents",
    "turns_of",
]

PARENT_KEY: Final = "parent_run"
"""The key of a turn's first stored message that names the turn it continues."""

START: Final = "start"
"""``branch_from`` for a new first turn: the run continues none of the session's turns (no run
id is ever ``start``: they are ``run_`` and hex)."""


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
    """Each turn's parent: the turn its first message names (None: it names none, a new
    first turn), else the turn before it."""
    known = {t.run_id for t in turns}
    found: dict[str, str | None] = {}
    previous: str | None = None
    for turn in turns:
        first = turn.messages[0].message if turn.messages else {}
        named = first.get(PARENT_KEY, previous)
        if named is None:
            found[turn.run_id] = None
        else:
            found[turn.run_id] = named if isinstance(named, str) and named in known else previous
        previous = turn.run_id
    return found


def branch_path(turns: Sequence[Turn], head: str | None = None) -> list[Turn]:
    """The turns from the first to ``head`` (default: the latest turn), following parents;
    none for ``START``."""
    if not turns or head == START:
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
    """``turn`` (stored form) with its first message naming ``branch_from``, when given
    (``START``: naming none)."""
    if branch_from is not None and turn:
        turn[0] = {**turn[0], PARENT_KEY: None if branch_from == START else branch_from}
    return turn


async def check_branch_from(
    store: Store, principal: str, session_id: str, branch_from: str
) -> None:
    """Check that a run may start in ``session_id`` with ``branch_from``: ``START``, or a run
    of the caller's session whose turn is stored.

    Raises ``NotFound`` for a run that is not one of this session's (another session's,
    another principal's, none), ``InvalidRequest`` (``not_a_turn``) for a run of the
    session that stored no turn (it failed, or has not ended).
    """
    if branch_from == START:
        return
    record = await store.get_run(branch_from)
    if record is None or record.session_id != session_id or record.principal != principal:
        raise NotFound(f"no run {branch_from!r} in session {session_id!r} to branch from")
    if not any(item.run_id == branch_from for item in await store.list_messages(session_id)):
        raise InvalidRequest(
            f"run {branch_from!r} stored no turn to branch from: it failed, or has not ended",
            code="not_a_turn",
        )
