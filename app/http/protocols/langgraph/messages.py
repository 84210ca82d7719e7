"""Our messages in LangChain's message format, as LangGraph clients read a thread's state.

A stored message (``message_to_dict``'s form) becomes a ``human``, ``ai`` (with
``tool_calls``) or ``tool`` message. A message's id is ``<run id>-<index within its run>``:
the same id whether the message is read back from the store or built from the run's log as
it streams, so a client merges a streamed chunk into the stored message it becomes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.http.protocols.media import (
    NativePart,
    PartRefused,
    data_url,
    media_part,
    text_part,
    unsupported_kind,
)

__all__ = [
    "ai_message",
    "human_message",
    "input_parts",
    "lc_messages",
    "message_id",
    "tool_message",
]


def message_id(run_id: str, index: int) -> str:
    """The id of the ``index``-th message a run added to its thread."""
    return f"{run_id}-{index}"


def human_message(content: Any, id_: str) -> dict[str, Any]:
    """A ``human`` message."""
    return {
        "type": "human",
        "content": content,
        "id": id_,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }


def ai_message(
    content: str, id_: str, tool_calls: Sequence[Mapping[str, Any]] = (), reasoning: str = ""
) -> dict[str, Any]:
    """An ``ai`` message; ``tool_calls`` as ``{"id", "name", "args"}``. With ``reasoning`` its
    content is LangChain's standard blocks: the reasoning, then the text (if any)."""
    return {
        "type": "ai",
        "content": ai_content(content, reasoning),
        "id": id_,
        "name": None,
        "tool_calls": [
            {"id": c["id"], "name": c["name"], "args": c["args"], "type": "tool_call"}
            for c in tool_calls
        ],
        "invalid_tool_calls": [],
        "additional_kwargs": {},
        "response_metadata": {},
        "usage_metadata": None,
    }


def ai_content(text: str, reasoning: str = "") -> str | list[dict[str, Any]]:
    """An AI message's content: its text, or with reasoning the standard content blocks
    (``{"type": "reasoning"}`` at index 0, ``{"type": "text"}`` at index 1), the shape its
    streamed chunks merge into."""
    if not reasoning:
        return text
    blocks: list[dict[str, Any]] = [{"type": "reasoning", "reasoning": reasoning, "index": 0}]
    if text:
        blocks.append({"type": "text", "text": text, "index": 1})
    return blocks


def tool_message(
    content: Any, id_: str, *, tool_call_id: str, name: str, is_error: bool
) -> dict[str, Any]:
    """A ``tool`` message."""
    return {
        "type": "tool",
        "content": content if isinstance(content, str) else _text_of(content),
        "id": id_,
        "name": name,
        "tool_call_id": tool_call_id,
        "status": "error" if is_error else "success",
        "artifact": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }


def _text_of(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, default=str)


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind in ("image", "document"):
            ref = part.get("ref") or part.get("file_id")
            url = part.get("url") or (f"/v1/files/{ref}/content" if ref else None)
            block: dict[str, Any] = {
                "type": "image" if kind == "image" else "file",
                "source_type": "url",
                "url": url,
                "mime_type": part.get("media_type"),
            }
            if part.get("filename"):
                block["metadata"] = {"filename": part["filename"]}
            blocks.append(block)
    return blocks


def lc_messages(stored: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """``(run_id, message_to_dict form)`` pairs, in order, as LangChain messages."""
    out: list[dict[str, Any]] = []
    index_in_run: dict[str, int] = {}
    for run_id, message in stored:
        index = index_in_run.get(run_id, 0)
        index_in_run[run_id] = index + 1
        id_ = message_id(run_id, index)
        role = message.get("role")
        if role == "user":
            out.append(human_message(_user_content(message.get("content")), id_))
        elif role == "assistant":
            calls = [
                {"id": c.get("id"), "name": c.get("name"), "args": c.get("arguments") or {}}
                for c in message.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            reasoning = message.get("reasoning")
            out.append(
                ai_message(
                    str(message.get("content") or ""),
                    id_,
                    calls,
                    reasoning if isinstance(reasoning, str) else "",
                )
            )
        elif role == "tool":
            out.append(
                tool_message(
                    message.get("content") or "",
                    id_,
                    tool_call_id=str(message.get("tool_call_id") or ""),
                    name=str(message.get("name") or ""),
                    is_error=bool(message.get("is_error")),
                )
            )
    return out


def input_parts(value: Any) -> list[NativePart] | None:
    """The last human message of a LangGraph ``input`` (``{"messages": [...]}``) as native
    run input parts, None when it has none.

    A message is ``{"role": "user"|"human", "content"}`` or ``{"type": "human", "content"}``;
    its content a string or LangChain content blocks: ``text``, ``image_url`` (a URL or a data
    URL), ``image`` and ``file`` (``url``, ``base64``/``data`` with ``mime_type``, or
    ``file_id``/``id`` of one of the caller's files). Any other block is refused
    (``PartRefused``, ``UnsupportedMediaType``): nothing a client sends is dropped.
    """
    if not isinstance(value, Mapping):
        return None
    messages = value.get("messages")
    if isinstance(messages, Mapping | str):
        messages = [messages]
    if not isinstance(messages, list):
        return None
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, str):
            return [text_part(message)]
        if not isinstance(message, Mapping):
            continue
        if (message.get("role") or message.get("type")) not in ("user", "human"):
            continue
        content = message.get("content")
        where = f"input.messages[{index}].content"
        if isinstance(content, str):
            return [text_part(content)]
        if not isinstance(content, list):
            raise PartRefused(where, f"{where}: a string or a list of content blocks")
        return [_block(block, f"{where}[{i}]") for i, block in enumerate(content)]
    return None


def _block(block: Any, where: str) -> NativePart:
    if isinstance(block, str):
        return text_part(block)
    if not isinstance(block, Mapping):
        raise PartRefused(where, f"{where}: a content block is an object")
    kind = block.get("type")
    if kind == "text":
        return text_part(str(block.get("text") or ""))
    if kind == "image_url":
        image_url = block.get("image_url")
        url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
        return media_part(where, url=_str(url), kind="image")
    if kind in ("image", "file"):
        media_type = _str(block.get("mime_type") or block.get("mimeType"))
        encoded = block.get("base64") or (
            block.get("data") if block.get("source_type") == "base64" else None
        )
        file_id = block.get("file_id") or (
            block.get("id") if block.get("source_type") == "id" else None
        )
        url = _str(block.get("url"))
        if isinstance(encoded, str):
            if media_type is None:
                raise PartRefused(where, f"{where}: base64 data needs its mime_type")
            url = data_url(media_type, encoded)
        metadata = block.get("metadata")
        filename = _str(block.get("filename")) or (
            _str(metadata.get("filename")) if isinstance(metadata, Mapping) else None
        )
        return media_part(
            where,
            url=url,
            file_id=_str(file_id),
            media_type=media_type,
            filename=filename,
            kind="image" if kind == "image" else None,
        )
    raise unsupported_kind(where, str(kind))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
