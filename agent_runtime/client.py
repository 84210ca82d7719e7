"""A small convenience client: an agent plus one-line ``run`` and ``stream``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any, Unpack

from .agent import AgentCore, ModelLike
from .events import AgentEvent
from .extensions.base import AgentExtension
from .messages import AssistantMessage
from .run_options import RunOptions

__all__ = ["AgentClient", "create_agent"]


class AgentClient:
    """Wraps an AgentCore; ``agent`` is the core itself."""

    def __init__(self, agent: AgentCore) -> None:
        self.agent = agent

    def stream(self, prompt: str, **options: Unpack[RunOptions]) -> AsyncIterator[AgentEvent]:
        """The run's events (see ``AgentCore.stream``)."""
        return self.agent.stream(prompt, **options)

    async def run(self, prompt: str, **options: Unpack[RunOptions]) -> AssistantMessage:
        """Run to completion and return the final assistant message."""
        return (await self.agent.chat(prompt, **options)).message

    async def aclose(self) -> None:
        """Close the agent."""
        await self.agent.aclose()


async def create_agent(
    model: ModelLike, *, extensions: Iterable[AgentExtension] = (), **options: Any
) -> AgentClient:
    """Build an agent on the running loop and wrap it in an AgentClient."""
    return AgentClient(await AgentCore.create(model, extensions=extensions, **options))
