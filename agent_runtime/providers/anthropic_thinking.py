"""Anthropic extended thinking: the blocks of a streamed answer, and what a request may ask.

In a stream, a ``thinking`` block's text comes in ``thinking_delta``s and its signature in a
``signature_delta``; a ``redacted_thinking`` block brings its encrypted ``data`` whole in its
start. ``ThinkingBlocks`` folds them into the answer's visible ``reasoning`` (the thinking
text) and its ``ReasoningState`` (provider ``"anthropic"``): the blocks in the answer's order,
exactly as the Messages API wants them back (``{"type": "thinking", "thinking",
"signature"}``, ``{"type": "redacted_thinking", "data"}``).

With thinking on, the Messages API requires the last assistant turn of a tool loop to start
with its thinking blocks, and refuses a ``tool_choice`` that forces a tool with manual
thinking (``{"type": "enabled", ...}``); ``thinking_mode`` and ``unsigned_tool_turn`` let the
provider ask for what it can send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..messages import ReasoningState

__all__ = ["WIRE", "ThinkingBlocks", "thinking_mode", "unsigned_tool_turn"]

#: ``ReasoningState.provider`` of Anthropic's blocks.
WIRE = "anthropic"

_THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})


@dataclass(slots=True)
class _Partial:
    text: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)


class ThinkingBlocks:
    """The thinking blocks of one streamed answer, by content block index."""

    __slots__ = ("_done", "_open", "_visible")

    def __init__(self) -> None:
        self._open: dict[int, _Partial] = {}
        self._done: dict[int, dict[str, Any]] = {}
        self._visible: list[str] = []

    def start(self, index: int, block: Any) -> str | None:
        """A content block starts; the reasoning text to stream, if it is thinking with some."""
        if block.type == "redacted_thinking":
            self._done[index] = {"type": "redacted_thinking", "data": block.data}
            return None
        if block.type != "thinking":
            return None
        partial = self._open[index] = _Partial()
        if block.signature:
            partial.signature.append(block.signature)
        return self._add(partial, block.thinking)

    def delta(self, index: int, delta: Any) -> str | None:
        """A delta of an open thinking block; the reasoning text to stream, if any."""
        partial = self._open.get(index)
        if partial is None:
            return None
        if delta.type == "thinking_delta":
            return self._add(partial, delta.thinking)
        if delta.type == "signature_delta":
            partial.signature.append(delta.signature)
        return None

    def stop(self, index: int) -> None:
        """A content block ends (a thinking block is whole now)."""
        partial = self._open.pop(index, None)
        if partial is not None:
            self._done[index] = {
                "type": "thinking",
                "thinking": "".join(partial.text),
                "signature": "".join(partial.signature),
            }

    def finish(self) -> tuple[str | None, ReasoningState | None]:
        """The answer's visible reasoning and its state (None, None without thinking)."""
        for index in list(self._open):  # a block the stream never closed
            self.stop(index)
        visible = "".join(self._visible) or None
        if not self._done:
            return visible, None
        blocks = tuple(self._done[index] for index in sorted(self._done))
        return visible, ReasoningState(WIRE, blocks)

    def _add(self, partial: _Partial, text: str) -> str | None:
        if not text:
            return None
        partial.text.append(text)
        shown = text
        if len(partial.text) == 1 and self._visible:
            shown = "\n\n" + text  # a second thinking block reads as a new paragraph
        self._visible.append(shown)
        return shown


def thinking_mode(params: Mapping[str, Any]) -> str | None:
    """The ``type`` of the request's ``thinking`` param (``enabled``, ``adaptive``, ...)."""
    thinking = params.get("thinking")
    if isinstance(thinking, Mapping):
        kind = thinking.get("type")
        return kind if isinstance(kind, str) and kind != "disabled" else None
    return None


def unsigned_tool_turn(turns: Sequence[Mapping[str, Any]]) -> bool:
    """True when the request continues a tool loop whose last assistant turn does not start
    with a thinking block (it came from another provider, or from a conversation stored
    without its state): the Messages API refuses such a request with thinking on."""
    if len(turns) < 2 or turns[-1].get("role") != "user":
        return False
    results = turns[-1].get("content")
    if not isinstance(results, list) or not any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in results
    ):
        return False
    assistant = turns[-2]
    content = assistant.get("content")
    if assistant.get("role") != "assistant" or not isinstance(content, list) or not content:
        return False
    first = content[0]
    return not (isinstance(first, Mapping) and first.get("type") in _THINKING_TYPES)
