"""Content parts as the HTTP API shows them: media by ``file_id``, never by bytes.

The runtime stores a media part by its content store's reference (``ref``, its ``size``);
the service's content store is its files, so a ``ref`` is a file id. Clients see the API's
names (``GET /v1/runs/{id}``'s ``input_parts``, ``GET /v1/sessions/{id}/messages``)::

    {"type": "text", "text": "..."}
    {"type": "image" | "document", "file_id": "file_...", "media_type": "image/png",
     "filename": "cat.png", "bytes": 1234, "sha256": "..."}
    {"type": "image" | "document", "url": "https://...", "media_type"?: ...}

``image`` is an image, ``document`` any other file (a ``file`` part of a run's input is shown
as the one it turned out to be). The bytes are at ``GET /v1/files/{file_id}/content``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["shown_message", "shown_part", "shown_parts"]

# the runtime's key -> the API's
_RENAMED = {"ref": "file_id", "size": "bytes"}


def shown_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """One stored part as the API shows it."""
    return {_RENAMED.get(key, key): value for key, value in part.items()}


def shown_parts(parts: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Stored parts as the API shows them (None stays None)."""
    return None if parts is None else [shown_part(part) for part in parts]


def shown_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the API shows it: the media parts of a user's content and of a
    tool's result by ``file_id``."""
    shown = dict(message)
    content = shown.get("content")
    if isinstance(content, list):
        shown["content"] = [shown_part(p) if isinstance(p, Mapping) else p for p in content]
    parts = shown.get("parts")
    if isinstance(parts, list):
        shown["parts"] = [shown_part(p) if isinstance(p, Mapping) else p for p in parts]
    return shown
