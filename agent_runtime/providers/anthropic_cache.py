"""Prompt caching on the Anthropic wire: where a request's ``cache_control`` breakpoints go.

The Messages API caches the prefix of a request up to each block marked ``cache_control``
(the prefix runs through the tools, then the system blocks, then the messages), with at
most four marks in one request. Unless the model param ``prompt_caching`` is false, a
request carries these, in this order of priority while marks are left:

1. the end of the conversation (the last block of the last turn): the whole request is
   written to the cache, and the next call (of the tool loop, or the session's next turn)
   reads it back;
2. the first system block (the agent's own instructions; later system messages, such as a
   compaction summary, follow in blocks of their own): tools and instructions stay cached
   when the conversation below them changes (compaction, a trimmed history, a new session
   of the same agent);
3. the end of the previous call's conversation (the last block of the user turn before the
   last assistant turn): the previous call's cache entry is hit even when the newest turn
   added more blocks than the API looks back across for an earlier entry;
4. the last tool definition: the tools alone, when the instructions change (a skill's).

Marks already in the request (a content part's own ``cache_control``) count against the four.
Thinking blocks and empty text blocks cannot be marked: the mark goes on the block before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MAX_BREAKPOINTS", "mark_breakpoints"]

#: The Messages API's limit of ``cache_control`` marks per request.
MAX_BREAKPOINTS = 4

_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def mark_breakpoints(
    tools: list[dict[str, Any]], system: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> None:
    """Put the breakpoints (see the module docstring) into the request's parts, in place.

    Marked blocks are replaced by marked copies: a block shared with a message (its reasoning
    state) is never changed.
    """
    budget = (
        MAX_BREAKPOINTS - _marks(tools) - _marks(system) - sum(_marks(_blocks(t)) for t in turns)
    )
    candidates = [
        _last_markable(_blocks(turns[-1])) if turns else None,
        (system, 0) if system and _markable(system[0]) else None,
        _previous_end(turns),
        (tools, len(tools) - 1) if tools else None,
    ]
    marked: set[tuple[int, int]] = set()
    for candidate in candidates:
        if budget <= 0:
            break
        if candidate is None:
            continue
        blocks, index = candidate
        if (id(blocks), index) in marked or "cache_control" in blocks[index]:
            continue
        blocks[index] = {**blocks[index], "cache_control": {"type": "ephemeral"}}
        marked.add((id(blocks), index))
        budget -= 1


def _blocks(turn: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = turn.get("content")
    return content if isinstance(content, list) else []


def _marks(blocks: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for block in blocks if isinstance(block, Mapping) and "cache_control" in block)


def _markable(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
        return False
    return not (block.get("type") == "text" and not block.get("text"))


def _last_markable(blocks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int] | None:
    for index in range(len(blocks) - 1, -1, -1):
        if _markable(blocks[index]):
            return blocks, index
    return None


def _previous_end(turns: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int] | None:
    """The last markable block of the user turn just before the last assistant turn."""
    for index in range(len(turns) - 1, 0, -1):
        if turns[index].get("role") == "assistant":
            before = turns[index - 1]
            return _last_markable(_blocks(before)) if before.get("role") == "user" else None
    return None
