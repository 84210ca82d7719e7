"""A tool result that carries images or documents: its text, its parts, and how it is shown.

A tool may return an ``ImagePart`` or a ``DocumentPart``, or a list mixing text (``str`` or
``TextPart``) and such parts (an MCP tool's image content arrives this way). The model reads the
text and is sent the parts (``ToolMessage.parts``); parts given as bytes are stored in the
agent's ``ContentStore`` first, so the conversation, its checkpoints and its events hold their
references only. What a run's events and extensions see of the result is its JSON description
(``described``): text as text, each part by reference, never bytes.

A part whose bytes are not what its media type says (or of a type no model takes, such as an
SVG) is not passed on: a line of the text names it instead, so the model knows it was there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..content import (
    ContentError,
    ContentPart,
    ContentStore,
    DocumentPart,
    ImagePart,
    MediaPart,
    TextPart,
    check_media,
    part_to_dict,
    store_parts,
)
from .execution import ToolExecutor

__all__ = ["MediaResult", "media_result"]


@dataclass(frozen=True, slots=True)
class MediaResult:
    """A tool's result with media: the text the model reads, its stored parts, and the
    result as events and extensions see it (JSON, parts by reference)."""

    text: str
    parts: list[MediaPart]
    described: Any


async def media_result(
    value: Any, store: ContentStore, session_id: str | None
) -> MediaResult | None:
    """``value`` (a tool's return value) with its parts stored, or None when it holds none
    (the common case: such a result is rendered as it always was)."""
    items = _items(value)
    if items is None:
        return None
    kept: list[ContentPart] = []
    for item in items:
        if isinstance(item, str):
            kept.append(TextPart(item))
            continue
        refusal = _refusal(item)
        kept.append(item if refusal is None else TextPart(refusal))
    stored = await store_parts(kept, store, session_id)
    texts = [p.text for p in stored if isinstance(p, TextPart)]
    parts = [p for p in stored if not isinstance(p, TextPart)]
    text = "\n".join(texts) or "\n".join(
        f"[{p.kind}: {p.media_type or 'unknown type'}]" for p in parts
    )
    described: Any = [p.text if isinstance(p, TextPart) else part_to_dict(p) for p in stored]
    if isinstance(value, ImagePart | DocumentPart) and len(stored) == 1:
        described = described[0]
    return MediaResult(text, parts, described)


def _items(value: Any) -> Sequence[str | ContentPart] | None:
    """The items of a result with media parts; None for any other result."""
    if isinstance(value, ImagePart | DocumentPart):
        return [value]
    if not isinstance(value, list | tuple) or not any(
        isinstance(v, ImagePart | DocumentPart) for v in value
    ):
        return None
    if not all(isinstance(v, str | TextPart | ImagePart | DocumentPart) for v in value):
        # a list with parts and other things: the other things go as their JSON text
        return [
            v
            if isinstance(v, str | TextPart | ImagePart | DocumentPart)
            else ToolExecutor.render(v)
            for v in value
        ]
    return list(value)


def _refusal(part: ContentPart) -> str | None:
    """Why ``part`` is not passed on, or None when it is fine."""
    if isinstance(part, TextPart) or part.data is None:
        return None
    try:
        check_media(part, part.data)
    except ContentError as exc:
        return f"[{part.kind} not passed on: {exc}]"
    return None
