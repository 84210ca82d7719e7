"""Content parts on the Anthropic Messages wire.

::

    text            {"type": "text", "text": ...}
    image           {"type": "image", "source": {"type": "base64", "media_type", "data"}}
                    or, given by URL, {"type": "image", "source": {"type": "url", "url"}}
    PDF document    {"type": "document", "source": {"type": "base64",
                                                    "media_type": "application/pdf", "data"}}
                    or, given by URL, {"type": "document", "source": {"type": "url", "url"}}
    text document   {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                    "data": <its text>}, "title": <filename>}

A ``data:`` URL goes as the base64 source it holds. A text document given by URL cannot be
sent (the URL source takes a PDF): UnsupportedContentError, before any request. A tool result
that came with images is a ``tool_result`` whose ``content`` is its text block followed by
their blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..content import IMAGE_MEDIA_TYPES, ContentPart, MediaPart, TextPart
from ..messages import ToolMessage
from .media import TEXT_DOCUMENT_TYPES, MediaReader

__all__ = ["tool_result_content", "user_blocks"]

_PDF = "application/pdf"


async def user_blocks(parts: Sequence[ContentPart], reader: MediaReader) -> list[dict[str, Any]]:
    """A user message's parts as content blocks (an empty text part is no block: the API
    refuses empty text)."""
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        else:
            blocks.append(await _media(part, reader))
    return blocks


async def tool_result_content(message: ToolMessage, reader: MediaReader) -> Any:
    """A ``tool_result`` block's ``content``: the text, or text and media blocks."""
    if not message.parts:
        return message.content
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend([await _media(part, reader) for part in message.parts])
    return blocks


async def _media(part: MediaPart, reader: MediaReader) -> dict[str, Any]:
    if part.kind == "image":
        return await _image(part, reader)
    return await _document(part, reader)


async def _image(part: MediaPart, reader: MediaReader) -> dict[str, Any]:
    url = reader.remote_url(part)
    if url is not None:
        return {"type": "image", "source": {"type": "url", "url": url}}
    media_type = reader.media_type(part)
    if media_type not in IMAGE_MEDIA_TYPES:
        raise reader.refuse(part, "the Messages API takes PNG, JPEG, GIF and WebP images")
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": await reader.base64(part)},
    }


async def _document(part: MediaPart, reader: MediaReader) -> dict[str, Any]:
    media_type = reader.media_type(part)
    url = reader.remote_url(part)
    block: dict[str, Any]
    if url is not None:
        if media_type not in (None, _PDF):
            raise reader.refuse(part, "the Messages API takes a document by URL only as a PDF")
        block = {"type": "document", "source": {"type": "url", "url": url}}
    elif media_type == _PDF:
        block = {
            "type": "document",
            "source": {"type": "base64", "media_type": _PDF, "data": await reader.base64(part)},
        }
    elif media_type in TEXT_DOCUMENT_TYPES:
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": await reader.text(part)},
        }
    else:
        raise reader.refuse(part, "the Messages API takes PDF and plain-text documents only")
    if part.filename:
        block["title"] = part.filename
    return block
