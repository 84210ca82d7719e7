"""Conversation messages exchanged with models, and their JSON form."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = [
    "AssistantMessage",
    "Message",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "message_from_dict",
    "message_to_dict",
    "messages_from_dicts",
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model's request to call one tool. ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SystemMessage:
    """Instructions for the model."""

    content: str
    role: Literal["system"] = "system"


@dataclass(slots=True)
class UserMessage:
    """What the user said."""

    content: str
    role: Literal["user"] = "user"


@dataclass(slots=True)
class AssistantMessage:
    """The model's answer: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    role: Literal["assistant"] = "assistant"


@dataclass(slots=True)
class ToolMessage:
    """The result of one tool call, as the model will read it.

    ``approval`` is ``"approved"`` or ``"denied"`` for a call that needed a person's approval
    (policy ``ask``), else None. Models never see it; front ends show it.
    """

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"
    approval: Literal["approved", "denied"] | None = None


Message: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage


def message_to_dict(message: Message) -> dict[str, Any]:
    """The JSON-ready form of a message, as stored and served over HTTP."""
    if isinstance(message, AssistantMessage):
        data: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            data["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
            ]
        return data
    if isinstance(message, ToolMessage):
        data = {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "name": message.name,
            "content": message.content,
            "is_error": message.is_error,
        }
        if message.approval is not None:
            data["approval"] = message.approval
        return data
    return {"role": message.role, "content": message.content}


def message_from_dict(data: dict[str, Any]) -> Message:
    """Rebuild a message from ``message_to_dict``'s form; raises ValueError on a bad shape."""
    role = data.get("role")
    if role == "user":
        return UserMessage(str(data.get("content") or ""))
    if role == "system":
        return SystemMessage(str(data.get("content") or ""))
    if role == "assistant":
        calls = [
            ToolCall(str(c["id"]), str(c["name"]), dict(c.get("arguments") or {}))
            for c in data.get("tool_calls") or []
        ]
        content = data.get("content")
        return AssistantMessage(None if content is None else str(content), calls)
    if role == "tool":
        approval = data.get("approval")
        return ToolMessage(
            str(data["tool_call_id"]),
            str(data.get("name") or ""),
            str(data.get("content") or ""),
            bool(data.get("is_error", False)),
            approval=approval if approval in ("approved", "denied") else None,
        )
    raise ValueError(f"unknown message role: {role!r}")


def messages_from_dicts(items: Iterable[dict[str, Any]]) -> list[Message]:
    """Rebuild a list of messages from their JSON form."""
    return [message_from_dict(item) for item in items]
