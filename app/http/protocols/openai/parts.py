"""The content parts of a user message, Responses' and Chat Completions', as native parts.

Responses: ``input_text``; ``input_image`` (``image_url``: an https or data URL, or
``file_id``: one of the caller's files); ``input_file`` (``file_data``: a data URL, with
``filename``; ``file_url``; or ``file_id``). Chat Completions: ``text``; ``image_url``
(``{"image_url": {"url"}}``); ``file`` (``{"file": {"file_data", "filename"}}`` or
``{"file": {"file_id"}}``). ``detail`` is a hint to OpenAI's own image pipeline: accepted, and
the provider's default applies. Audio (``input_audio``) and any other part are refused with
``PartRefused``, ``param`` naming the part as OpenAI's errors do (``input[0].content[1]``).
"""

from __future__ import annotations

from typing import Any

from app.errors import ServiceError
from app.http.protocols.media import (
    NativePart,
    PartRefused,
    media_part,
    text_part,
    unsupported_kind,
)

__all__ = ["chat_content", "responses_content"]

_TEXT_TYPES = ("text", "input_text", "output_text")


def _string(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise PartRefused(param, f"{param}: expected a string")
    return value


def _unsupported(kind: Any, param: str, accepted: str) -> ServiceError:
    if kind in ("input_audio", "audio"):
        return unsupported_kind(param, "audio")
    return PartRefused(
        param, f"{param}: content part of type {kind!r} is not supported; it takes {accepted}"
    )


def responses_content(content: Any, param: str) -> list[NativePart]:
    """A Responses message's ``content`` (a string, or parts) as native parts."""
    if isinstance(content, str):
        return [text_part(content)]
    if not isinstance(content, list):
        raise PartRefused(param, f"{param}: expected a string or a list of content parts")
    parts: list[NativePart] = []
    for index, item in enumerate(content):
        where = f"{param}[{index}]"
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(item, dict) and kind in _TEXT_TYPES and isinstance(item.get("text"), str):
            parts.append(text_part(item["text"]))
        elif isinstance(item, dict) and kind == "input_image":
            parts.append(
                media_part(
                    where,
                    url=_string(item.get("image_url"), f"{where}.image_url"),
                    file_id=_string(item.get("file_id"), f"{where}.file_id"),
                    kind="image",
                )
            )
        elif isinstance(item, dict) and kind == "input_file":
            parts.append(_input_file(item, where))
        else:
            raise _unsupported(kind, where, "input_text, input_image and input_file")
    return parts


def _input_file(item: dict[str, Any], where: str) -> NativePart:
    data = _string(item.get("file_data"), f"{where}.file_data")
    url = _string(item.get("file_url"), f"{where}.file_url")
    file_id = _string(item.get("file_id"), f"{where}.file_id")
    filename = _string(item.get("filename"), f"{where}.filename")
    if data is not None and url is not None:
        raise PartRefused(where, f"{where}: give one of file_data, file_url and file_id")
    if data is not None and not data.startswith("data:"):
        raise PartRefused(
            f"{where}.file_data",
            f"{where}.file_data: expected a data: URL (data:application/pdf;base64,...)",
        )
    return media_part(
        where,
        url=data if data is not None else url,
        file_id=file_id,
        filename=filename,
        kind="file",
    )


def chat_content(content: Any, param: str) -> list[NativePart]:
    """A Chat Completions message's ``content`` (a string, or parts) as native parts."""
    if isinstance(content, str):
        return [text_part(content)]
    if not isinstance(content, list):
        raise PartRefused(param, f"{param}: expected a string or a list of content parts")
    parts: list[NativePart] = []
    for index, item in enumerate(content):
        where = f"{param}[{index}]"
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(item, dict) and kind == "text" and isinstance(item.get("text"), str):
            parts.append(text_part(item["text"]))
        elif isinstance(item, dict) and kind == "image_url":
            image = item.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            parts.append(
                media_part(where, url=_string(url, f"{where}.image_url.url") or "", kind="image")
            )
        elif isinstance(item, dict) and kind == "file":
            parts.append(_chat_file(item.get("file"), where))
        else:
            raise _unsupported(kind, where, "text, image_url and file")
    return parts


def _chat_file(file: Any, where: str) -> NativePart:
    if not isinstance(file, dict):
        raise PartRefused(
            f"{where}.file", f"{where}.file: expected {{file_data, filename}} or {{file_id}}"
        )
    data = _string(file.get("file_data"), f"{where}.file.file_data")
    if data is not None and not data.startswith("data:"):
        raise PartRefused(
            f"{where}.file.file_data",
            f"{where}.file.file_data: expected a data: URL (data:application/pdf;base64,...)",
        )
    return media_part(
        where,
        url=data,
        file_id=_string(file.get("file_id"), f"{where}.file.file_id"),
        filename=_string(file.get("filename"), f"{where}.file.filename"),
        kind="file",
    )
