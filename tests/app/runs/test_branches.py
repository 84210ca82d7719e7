"""A session's branches: each turn continues the one before it unless it names another."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.runs.branches import PARENT_KEY, START, branch_path, mark_branch, parents, turns_of
from app.storage import StoredMessage

_FIRST = object()
"""A turn that names no parent: a new first turn (``branch_from`` ``START``)."""


def _stored(*turns: tuple[str, str | object | None]) -> list[StoredMessage]:
    items: list[StoredMessage] = []
    for run_id, parent in turns:
        user: dict[str, Any] = {"role": "user", "content": run_id}
        if parent is _FIRST:
            user[PARENT_KEY] = None
        elif parent is not None:
            user[PARENT_KEY] = parent
        for message in (user, {"role": "assistant", "content": f"answer {run_id}"}):
            items.append(
                StoredMessage(
                    session_id="s",
                    run_id=run_id,
                    position=len(items),
                    role=str(message["role"]),
                    message=message,
                    created_at=datetime.now(UTC),
                )
            )
    return items


def _ids(path: list[Any]) -> list[str]:
    return [turn.run_id for turn in path]


def test_a_session_that_never_forked_is_one_path() -> None:
    turns = turns_of(_stored(("r1", None), ("r2", None), ("r3", None)))
    assert _ids(branch_path(turns)) == ["r1", "r2", "r3"]
    assert _ids(branch_path(turns, "r2")) == ["r1", "r2"]
    assert parents(turns) == {"r1": None, "r2": "r1", "r3": "r2"}


def test_a_fork_and_the_turns_after_it() -> None:
    # r3 branches from r1; r4 continues r3 (the turn stored before it)
    turns = turns_of(_stored(("r1", None), ("r2", None), ("r3", "r1"), ("r4", None)))
    assert _ids(branch_path(turns)) == ["r1", "r3", "r4"]
    assert _ids(branch_path(turns, "r2")) == ["r1", "r2"]
    assert _ids(branch_path(turns, "unknown")) == ["r1", "r3", "r4"]


def test_a_parent_that_is_no_turn_of_the_session_is_ignored() -> None:
    turns = turns_of(_stored(("r1", None), ("r2", "elsewhere")))
    assert _ids(branch_path(turns)) == ["r1", "r2"]


def test_mark_branch_names_the_parent_on_the_first_message_only() -> None:
    turn = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    marked = mark_branch(list(turn), "r1")
    assert marked[0][PARENT_KEY] == "r1" and PARENT_KEY not in marked[1]
    assert mark_branch(list(turn), None) == turn


def test_a_new_first_turn_and_the_turns_after_it() -> None:
    # r3 starts again from the start; r4 continues it
    turns = turns_of(_stored(("r1", None), ("r2", None), ("r3", _FIRST), ("r4", None)))
    assert parents(turns) == {"r1": None, "r2": "r1", "r3": None, "r4": "r3"}
    assert _ids(branch_path(turns)) == ["r3", "r4"]
    assert _ids(branch_path(turns, "r2")) == ["r1", "r2"]
    assert branch_path(turns, START) == []


def test_mark_branch_from_the_start_names_no_parent() -> None:
    marked = mark_branch([{"role": "user", "content": "x"}], START)
    assert marked == [{"role": "user", "content": "x", PARENT_KEY: None}]
