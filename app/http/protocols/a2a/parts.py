"""An A2A message's parts as the native run input's parts, and a stored input's parts as A2A's.

A2A 1.0 carries a file in a ``Part``: ``raw`` (its bytes, base64 in JSON) or ``url`` (https or
a data URL), with ``media_type`` and ``filename``. The SDK's 0.3 compatibility turns the older
``FilePart`` (``FileWithBytes`` / ``FileWithUri``) into the same. An image is a part whose media
type is ``image/...``; any other file is a document. ``data`` parts answer a task's question
(``RunTaskHandler``); in a message that starts a task they are refused, as is a file without a
media type: nothing a client sent is dropped.

The other way, a task's history shows the stored input: text as text parts, a stored file as a
``url`` part naming ``/v1/files/{file_id}/content``, never its bytes.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterable, Mapping
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import ContentTypeNotSupportedError

from app.http.protocols.media import (
    NativePart,
    PartRefused,
    data_url,
    data_url_of_bytes,
    kind_of,
    media_part,
    media_refused,
    text_part,
)

__all__ = ["history_parts", "message_parts", "refuse_unsupported_parts"]

# bytes above this are base64-encoded off the event loop
_OFF_LOOP_BYTES = 256 * 1024


async def message_parts(
    message: pb.Message, media: Mapping[str, str] | None = None, param: str = "message.parts"
) -> list[NativePart]:
    """The message's parts, in order, as native parts (``PartRefused`` for what cannot go).

    ``media``: the base64 strings set aside from the request's body, by the placeholders the
    SDK parsed in their place (``app.http.protocols.a2a.endpoint.set_media_aside``).
    """
    media = media or {}
    parts: list[NativePart] = []
    for index, part in enumerate(message.parts):
        where = f"{param}[{index}]"
        content = part.WhichOneof("content")
        if content == "text":
            media_type = part.media_type.lower()
            if media_type and not media_type.startswith("text/"):
                raise media_refused(
                    where,
                    f"{where}: a text part of type {media_type} is not an input this agent "
                    "takes (text parts are text/*)",
                )
            if part.text:
                parts.append(text_part(part.text))
        elif content == "raw":
            parts.append(await _raw(part, where, media))
        elif content == "url":
            parts.append(
                media_part(
                    where,
                    url=media.get(part.url, part.url),
                    media_type=part.media_type or None,
                    filename=part.filename or None,
                )
            )
        elif content == "data":
            raise PartRefused(
                where,
                f"{where}: a data part answers a task's question (send it with the task's "
                "taskId); a message that starts a task takes text and file parts",
            )
        else:
            raise PartRefused(where, f"{where}: the part is empty")
    return parts


async def _raw(part: pb.Part, where: str, media: Mapping[str, str]) -> NativePart:
    media_type = part.media_type
    if not media_type:
        raise PartRefused(where, f"{where}: a file's bytes need their mediaType")
    if kind_of(media_type) is None:
        raise PartRefused(where, f"{where}: the mediaType is empty")
    raw = part.raw
    # the base64 the body carried, set aside before the SDK parsed it: as it came
    original = media.get(base64.b64encode(raw).decode("ascii")) if len(raw) == 24 else None
    if original is not None:
        url = data_url(media_type, original)
    elif len(raw) > _OFF_LOOP_BYTES:
        url = await asyncio.to_thread(data_url_of_bytes, media_type, raw)
    else:
        url = data_url_of_bytes(media_type, raw)
    return media_part(where, url=url, media_type=media_type, filename=part.filename or None)


def history_parts(stored: Iterable[Mapping[str, Any]], files_url: str = "") -> list[pb.Part]:
    """A stored input's parts (``{"type": "text" | "image" | "document", ...}``) as A2A parts:
    a stored file as a ``url`` part naming its content (``files_url`` is the service's base
    URL), a URL the input gave as that URL."""
    parts: list[pb.Part] = []
    for item in stored:
        kind = item.get("type")
        if kind == "text":
            parts.append(pb.Part(text=str(item.get("text") or "")))
            continue
        ref = item.get("ref") or item.get("file_id")
        url = f"{files_url}/v1/files/{ref}/content" if ref else str(item.get("url") or "")
        part = pb.Part(url=url)
        if isinstance(item.get("media_type"), str):
            part.media_type = item["media_type"]
        if isinstance(item.get("filename"), str):
            part.filename = item["filename"]
        parts.append(part)
    return parts


def _answer_part(part: pb.Part) -> bool:
    kind = part.WhichOneof("content")
    media = part.media_type.lower()
    if kind == "text":
        return not media or media.startswith("text/")
    if kind == "data":
        return not media or media == "application/json"
    return False


def refuse_unsupported_parts(message: pb.Message) -> None:
    """For a message on an existing task (the answer to its question): text and data parts
    only; ``ContentTypeNotSupportedError`` (-32005) for the first other part."""
    for index, part in enumerate(message.parts):
        if not _answer_part(part):
            kind = part.WhichOneof("content") or "empty"
            media = part.media_type or "no media type"
            raise ContentTypeNotSupportedError(
                f"message.parts[{index}]: a {kind} part ({media}) cannot answer a task's "
                "question: send text, or a data part with the answer"
            )
