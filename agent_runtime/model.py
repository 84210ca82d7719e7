"""The model protocol: what the runtime asks of a model, and what a model streams back.

A model is any object with ``stream(request) -> AsyncIterator[ModelEvent]``. It yields text
deltas, reasoning deltas and tool calls as they arrive and ends with exactly one ``completed``
event carrying the whole ``ModelResponse``. An optional ``retry`` attribute (``RetryOptions``)
says how often the runtime may repeat a call that failed with a retryable ``ProviderError``
before anything of it reached the consumer.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .content import ContentError, ContentStore, MediaPart
from .messages import AssistantMessage, Message, ToolCall

__all__ = [
    "Model",
    "ModelEvent",
    "ModelEventKind",
    "ModelRequest",
    "ModelResponse",
    "OutputSchema",
    "RetryOptions",
    "ToolSpec",
    "Usage",
]


@dataclass(frozen=True, slots=True)
class RetryOptions:
    """How the runtime repeats a model call that failed with a retryable ProviderError.

    Delays grow from ``initial_delay`` by ``multiplier`` up to ``max_delay``; an upstream's
    Retry-After, when larger, wins (capped at ``max_retry_after``).
    """

    max_retries: int = 2
    initial_delay: float = 0.5
    max_delay: float = 8.0
    multiplier: float = 2.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and multiplier >= 1")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        backoff = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        if retry_after is not None:
            return max(backoff, min(retry_after, self.max_retry_after))
        return backoff


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as advertised to a model: name, description and JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutputSchema:
    """The JSON schema a call's answer must match (structured output).

    A provider with a native form uses it (OpenAI ``response_format`` json_schema, Anthropic a
    forced tool named ``name``) and answers with the JSON as its text; other models get the
    schema as an instruction in the system prompt.
    """

    name: str
    schema: dict[str, Any]
    strict: bool = False


@dataclass(slots=True)
class Usage:
    """Token counts of one model call, or summed over a run.

    ``model`` names the model that answered the call (a fallback binding's when the primary
    failed over); in a run's total it is the model of the latest call.

    ``input_tokens`` counts every input token, cached or not; ``cached_input_tokens`` (read from
    a prompt cache) and ``cache_write_tokens`` (written to one) are the parts of it the provider
    reports. ``reasoning_tokens`` is the part of ``output_tokens`` spent reasoning. Each of the
    three is None where the provider reports nothing.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None

    def add(self, other: Usage | None) -> None:
        """Add another call's counts to these (and take its model, when it names one)."""
        if other is not None:
            self.input_tokens += other.input_tokens
            self.output_tokens += other.output_tokens
            for name in _DETAILS:
                theirs = getattr(other, name)
                if theirs is not None:
                    setattr(self, name, (getattr(self, name) or 0) + theirs)
            if other.model is not None:
                self.model = other.model

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used on the wire; ``model`` and the details only when known."""
        data: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        for name in _DETAILS:
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        if self.model is not None:
            data["model"] = self.model
        return data


_DETAILS = ("cached_input_tokens", "cache_write_tokens", "reasoning_tokens")


@dataclass(slots=True)
class ModelRequest:
    """One model call: the conversation so far, the advertised tools and call metadata."""

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    system: str | None = None
    run_id: str = ""
    session_id: str | None = None
    model_call_id: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    output_schema: OutputSchema | None = None
    #: where the bytes of the conversation's media parts are (``ContentStore.get(ref)``)
    content_store: ContentStore | None = None
    #: an opaque key, the same for every call of one agent in one session: providers with a
    #: prompt cache keyed by the caller (OpenAI's ``prompt_cache_key``) send it
    cache_key: str | None = None

    async def media_bytes(self, part: MediaPart) -> bytes:
        """The bytes of a media part: its own, or its ref's from ``content_store``."""
        if part.data is not None:
            return part.data
        if part.ref is None:
            raise ContentError(f"a {part.kind} part given by URL has no bytes here")
        if self.content_store is None:
            raise ContentError(f"no content store to read {part.ref!r} from")
        return await self.content_store.get(part.ref)


@dataclass(slots=True)
class ModelResponse:
    """The whole answer of one model call."""

    message: AssistantMessage
    usage: Usage | None = None
    stop_reason: str | None = None


class ModelEventKind(enum.Enum):
    """What a ModelEvent carries."""

    TEXT = "text"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    COMPLETED = "completed"


@dataclass(slots=True)
class ModelEvent:
    """One item of a model's stream. Build it with ``text``, ``reasoning``, ``tool_call`` or
    ``completed``."""

    kind: ModelEventKind
    delta: str = ""
    call: ToolCall | None = None
    response: ModelResponse | None = None

    @classmethod
    def text(cls, delta: str) -> ModelEvent:
        """A piece of the answer's text."""
        return cls(ModelEventKind.TEXT, delta)

    @classmethod
    def reasoning(cls, delta: str) -> ModelEvent:
        """A piece of the model's visible reasoning (thinking, a reasoning summary)."""
        return cls(ModelEventKind.REASONING, delta)

    @classmethod
    def tool_call(cls, call: ToolCall) -> ModelEvent:
        """A complete tool call (arguments fully assembled)."""
        return cls(ModelEventKind.TOOL_CALL, call=call)

    @classmethod
    def completed(cls, response: ModelResponse) -> ModelEvent:
        """The end of the call, with the whole response."""
        return cls(ModelEventKind.COMPLETED, response=response)


@runtime_checkable
class Model(Protocol):
    """Anything that streams ModelEvents for a ModelRequest."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the answer to ``request``; end with one ``completed`` event."""
        ...
