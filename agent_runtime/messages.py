"""Conversation messages exchanged with models, and their JSON form.

A user message's content is a string or a list of content parts (``agent_runtime.content``:
text, images, documents); a tool result may carry images beside its text. Serialised messages
hold media parts by reference, never their bytes.

An assistant message may keep the model's reasoning: ``reasoning`` is its visible text (shown,
stored), ``reasoning_state`` the provider's opaque, signed blocks that must go back to the same
provider within a run. ``message_to_dict`` leaves the state out unless asked (``private=True``,
for checkpoints), so it never reaches a client or the stored conversation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .content import (
    ContentPart,
    MediaPart,
    TextPart,
    content_text,
    part_from_dict,
    part_to_dict,
)

__all__ = [
    "AssistantMessage",
    "Message",
    "ReasoningState",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "message_from_dict",
    "message_text",
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
    """What the user said: a string, or content parts (text, images, documents)."""

    content: str | list[ContentPart]
    role: Literal["user"] = "user"

    @property
    def text(self) -> str:
        """The message's text: the string, or its text parts joined."""
        return content_text(self.content)

    @property
    def parts(self) -> list[ContentPart]:
        """The content as parts (a string is one text part)."""
        if isinstance(self.content, str):
            return [TextPart(self.content)]
        return list(self.content)


@dataclass(frozen=True, slots=True)
class ReasoningState:
    """A provider's opaque reasoning blocks, to be sent back to the same provider as they are.

    ``provider`` names the wire they belong to (``"anthropic"``, ``"openai-responses"``);
    ``blocks`` are that wire's own JSON objects (Anthropic ``thinking`` with its ``signature``
    and ``redacted_thinking``; Responses ``reasoning`` items with ``encrypted_content``).
    """

    provider: str
    blocks: tuple[dict[str, Any], ...] = ()


@dataclass(slots=True)
class AssistantMessage:
    """The model's answer: text, tool calls, or both; and its reasoning, where it gave some."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    role: Literal["assistant"] = "assistant"
    reasoning: str | None = None
    reasoning_state: ReasoningState | None = None

    def reasoning_blocks(self, provider: str) -> list[dict[str, Any]]:
        """Copies of the reasoning state's blocks when ``provider`` made them, else none.

        A provider building its request asks for its own wire's blocks only: another
        provider's signed state (a fallback binding's conversation) is never sent, and the
        visible ``reasoning`` text stays the record of it, not sent as reasoning either.
        """
        state = self.reasoning_state
        if state is None or state.provider != provider:
            return []
        return [copy.deepcopy(block) for block in state.blocks]


@dataclass(slots=True)
class ToolMessage:
    """The result of one tool call, as the model will read it.

    ``approval`` is ``"approved"`` or ``"denied"`` for a call that needed a person's approval
    (policy ``ask``), else None. Models never see it; front ends show it. ``parts``: images
    (or documents) the tool returned beside its text, such as an MCP tool's image content.
    """

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"
    approval: Literal["approved", "denied"] | None = None
    parts: list[MediaPart] = field(default_factory=list)


Message: TypeAlias = SystemMessage | UserMessage | AssistantMessage | ToolMessage


def message_text(message: Message) -> str:
    """A message's text: a user message's text parts, any other message's content ("" for an
    assistant message without text). Never the bytes or references of its media parts."""
    if isinstance(message, UserMessage):
        return message.text
    return message.content or ""


def message_to_dict(message: Message, *, private: bool = False) -> dict[str, Any]:
    """The JSON-ready form of a message, as stored and served over HTTP.

    Media parts appear by reference (a part still holding bytes raises ContentError).
    ``private`` keeps an assistant message's ``reasoning_state`` (checkpoints need it to go on;
    nothing a client reads may hold it).
    """
    if isinstance(message, AssistantMessage):
        data: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            data["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
            ]
        if message.reasoning:
            data["reasoning"] = message.reasoning
        if private and message.reasoning_state is not None:
            data["reasoning_state"] = {
                "provider": message.reasoning_state.provider,
                "blocks": list(message.reasoning_state.blocks),
            }
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
        if message.parts:
            data["parts"] = [part_to_dict(p) for p in message.parts]
        return data
    if isinstance(message, UserMessage) and not isinstance(message.content, str):
        return {"role": "user", "content": [part_to_dict(p) for p in message.content]}
    return {"role": message.role, "content": message.content}


def message_from_dict(data: dict[str, Any]) -> Message:
    """Rebuild a message from ``message_to_dict``'s form; raises ValueError on a bad shape."""
    role = data.get("role")
    if role == "user":
        content = data.get("content")
        if isinstance(content, list):
            return UserMessage([part_from_dict(dict(p)) for p in content])
        return UserMessage(str(content or ""))
    if role == "system":
        return SystemMessage(str(data.get("content") or ""))
    if role == "assistant":
        calls = [
            ToolCall(str(c["id"]), str(c["name"]), dict(c.get("arguments") or {}))
            for c in data.get("tool_calls") or []
        ]
        content = data.get("content")
        state = data.get("reasoning_state")
        reasoning_state = (
            ReasoningState(str(state["provider"]), tuple(dict(b) for b in state["blocks"]))
            if isinstance(state, dict)
            else None
        )
        reasoning = data.get("reasoning")
        return AssistantMessage(
            None if content is None else str(content),
            calls,
            reasoning=None if reasoning is None else str(reasoning),
            reasoning_state=reasoning_state,
        )
    if role == "tool":
        approval = data.get("approval")
        return ToolMessage(
            str(data["tool_call_id"]),
            str(data.get("name") or ""),
            str(data.get("content") or ""),
            bool(data.get("is_error", False)),
            approval=approval if approval in ("approved", "denied") else None,
            parts=[
                p
                for p in (part_from_dict(dict(x)) for x in data.get("parts") or [])
                if not isinstance(p, TextPart)
            ],
        )
    raise ValueError(f"unknown message role: {role!r}")


def messages_from_dicts(items: Iterable[dict[str, Any]]) -> list[Message]:
    """Rebuild a list of messages from their JSON form."""
    return [message_from_dict(item) for item in items]
