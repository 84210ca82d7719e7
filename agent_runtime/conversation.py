"""Where a session's conversation lives between runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .messages import Message

__all__ = ["ConversationStore", "InMemoryConversationStore"]


class ConversationStore(Protocol):
    """Where a session's conversation lives between runs."""

    async def load(self, session_id: str) -> list[Message]:
        """The session's messages, oldest first."""
        ...

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add one completed run's messages atomically."""
        ...


class InMemoryConversationStore:
    """A ConversationStore in a dict; for scripts and tests."""

    def __init__(self) -> None:
        self._sessions: dict[str, list[Message]] = {}

    async def load(self, session_id: str) -> list[Message]:
        return list(self._sessions.get(session_id, ()))

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self._sessions.setdefault(session_id, []).extend(messages)

    def clear(self, session_id: str) -> None:
        """Forget a session."""
        self._sessions.pop(session_id, None)
