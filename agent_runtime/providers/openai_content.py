"""Content parts on the Chat Completions wire.

A user message with parts is a content array::

    text                  {"type": "text", "text": ...}
    image                 {"type": "image_url", "image_url": {"url": <https URL as given, or
                                                              data:<type>;base64,...>}}
    PDF document          {"type": "file", "file": {"filename": ..., "file_data":
                                                    "data:application/pdf;base64,..."}}
    text document         {"type": "text", "text": "Document <name> (<type>):\\n\\n<text>"}

The file part takes a PDF, and only as its bytes: a plain-text document goes as its text, under
a header naming it, and a document given by URL cannot be sent on this wire at all
(UnsupportedContentError, before any request).

A tool message takes text only, so the images (and documents) a tool returned follow the tool
results of that turn as one user message (``tool_media_message``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..content import IMAGE_MEDIA_TYPES, ContentPart, MediaPart, TextPart
from ..messages import ToolMessage
from .media import TEXT_DOCUMENT_TYPES, MediaReader

__all__ = ["content_array", "tool_media_message"]

_PDF = "application/pdf"


async def content_array(parts: Sequence[ContentPart], reader: MediaReader) -> list[dict[str, Any]]:
    """A user message's parts as the content array of a Chat Completions message."""
    return [await _part(part, reader) for part in parts]


async def tool_media_message(
    results: Sequence[ToolMessage], reader: MediaReader
) -> dict[str, Any] | None:
    """The user message that carries what ``results`` (one turn's tool results) returned
    beside their text, or None when they returned only text."""
    content: list[dict[str, Any]] = []
    for result in results:
        if not result.parts:
            continue
        content.append(
            {
                "type": "text",
                "text": f"The result of tool call {result.tool_call_id} ({result.name}) "
                "came with this content:",
            }
        )
        content.extend([await _part(part, reader) for part in result.parts])
    return {"role": "user", "content": content} if content else None


async def _part(part: ContentPart, reader: MediaReader) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if part.kind == "image":
        media_type = reader.media_type(part)
        if media_type is not None and media_type not in IMAGE_MEDIA_TYPES:
            raise reader.refuse(part, "Chat Completions takes PNG, JPEG, GIF and WebP images")
        url = reader.remote_url(part) or await reader.data_url(part)
        return {"type": "image_url", "image_url": {"url": url}}
    return await _document(part, reader)


async def _document(part: MediaPart, reader: MediaReader) -> dict[str, Any]:
    media_type = reader.media_type(part)
    if reader.remote_url(part) is not None:
        raise reader.refuse(
            part, "Chat Completions takes a document as its bytes, not by URL; upload it"
        )
    if media_type == _PDF:
        return {
            "type": "file",
            "file": {
                "filename": part.filename or "document.pdf",
                "file_data": await reader.data_url(part),
            },
        }
    if media_type in TEXT_DOCUMENT_TYPES:
        text = await reader.text(part)
        return {
            "type": "text",
            "text": f"Document {part.filename or 'untitled'} ({media_type}):\n\n{text}",
        }
    raise reader.refuse(part, "Chat Completions takes PDF and plain-text documents only")
