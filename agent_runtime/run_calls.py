"""``chat_structured`` and ``run_skill``: runs with a shape, each one run under one clock.

Both are one ``chat`` run: one ``run_id``, one ``run_timeout`` covering the catalogue load,
every model call (validation retries included) and every tool. Nothing restarts the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack, overload

from .errors import RunError

if TYPE_CHECKING:
    from .messages import Message
    from .run_context import AgentResponse, AgentRunConfig
    from .run_options import RunOptions, SkillRunOptions, StructuredRunOptions

__all__ = ["ChatHost", "RunCalls", "StructuredResponse"]

T = TypeVar("T")


@dataclass(slots=True)
class StructuredResponse(Generic[T]):
    """The outcome of ``chat_structured``: the validated ``output`` and the run's response."""

    output: T
    response: AgentResponse

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.response.run_id


class ChatHost(Protocol):
    """What ``RunCalls`` needs from the class it is mixed into (``AgentCore``)."""

    async def chat(
        self,
        prompt: str,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[RunOptions],
    ) -> AgentResponse:
        """Run to completion and return the response."""
        ...


class RunCalls:
    """The structured and skill entry points of ``AgentCore``: each takes its host as a
    ``ChatHost``, so a host without ``chat`` is a type error where they are used."""

    @overload
    async def chat_structured(
        self: ChatHost,
        prompt: str,
        *,
        output_type: type[T],
        output_retries: int | None = None,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[StructuredRunOptions],
    ) -> StructuredResponse[T]: ...

    @overload
    async def chat_structured(
        self: ChatHost,
        prompt: str,
        *,
        output_type: Any,
        output_retries: int | None = None,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[StructuredRunOptions],
    ) -> StructuredResponse[Any]: ...

    async def chat_structured(
        self: ChatHost,
        prompt: str,
        *,
        output_type: Any,
        output_retries: int | None = None,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[StructuredRunOptions],
    ) -> StructuredResponse[Any]:
        """Run to completion with an answer validated against ``output_type``.

        ``output_type`` is a pydantic model or any type a ``TypeAdapter`` accepts. The model is
        asked for JSON (natively where the provider can); an answer that does not validate is
        given back with its error, at most ``output_retries`` times (default 2). Still invalid:
        ``StructuredOutputError``. Other options are ``chat``'s.
        """
        response = await self.chat(
            prompt,
            config=config,
            conversation=conversation,
            output_type=output_type,
            output_retries=output_retries,
            **options,
        )
        if response.structured is None:  # pragma: no cover - a completed run validated
            raise RunError("the run completed without a validated answer", run_id=response.run_id)
        return StructuredResponse(response.structured.value, response)

    async def run_skill(
        self: ChatHost,
        name: str,
        prompt: str,
        *,
        config: AgentRunConfig | None = None,
        conversation: Sequence[Message] | None = None,
        **options: Unpack[SkillRunOptions],
    ) -> AgentResponse:
        """Run ``prompt`` with the skill ``name`` active from the start (no dispatch).

        An unknown skill raises ``SkillNotFoundError`` (the run fails); ``output_type=`` makes
        it structured too. Other options are ``chat``'s.
        """
        return await self.chat(
            prompt,
            config=config,
            conversation=conversation,
            skill=name,
            skill_dispatch=False,
            **options,
        )
