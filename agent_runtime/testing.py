"""Deterministic offline models for tests, examples and docs.

``ScriptedModel`` replays a script of turns, one per model call, and records every request;
``assert_consumed()`` checks that the test used the whole script. ``FunctionModel`` answers each
request with a function of it.

A turn is one of:

- ``str``: the answer's text, streamed one word per delta;
- ``AssistantMessage`` or ``ModelResponse``: its ``reasoning`` streamed by word (reasoning
  events), then its text by word, then its tool calls;
- a list of ``ModelEvent``: replayed as given (add the ``completed`` event yourself);
- an exception instance: raised by the call (a ``ProviderError`` exercises retries/failover);
- a callable taking the ``ModelRequest`` and returning any of the above.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeAlias, cast

from .input_kinds import ALL_INPUT_KINDS, as_input_kinds
from .messages import AssistantMessage, ToolCall, message_text
from .model import ModelEvent, ModelEventKind, ModelRequest, ModelResponse, RetryOptions, Usage

__all__ = ["FunctionModel", "ScriptedModel", "Turn", "tool_call_turn", "words"]

Turn: TypeAlias = (
    Any  # str | AssistantMessage | ModelResponse | list[ModelEvent] | BaseException | callable
)

_WORD = re.compile(r"\S+\s*|\s+")


def words(text: str) -> list[str]:
    """Split text into deltas of one word each (with the whitespace that follows it)."""
    return _WORD.findall(text)


def tool_call_turn(
    name: str, arguments: dict[str, Any] | None = None, *, call_id: str | None = None
) -> AssistantMessage:
    """A turn that calls one tool."""
    return AssistantMessage(
        None, [ToolCall(call_id or f"call_{name}", name, dict(arguments or {}))]
    )


def _usage_for(request: ModelRequest, message: AssistantMessage) -> Usage:
    prompt_words = sum(len(message_text(m).split()) for m in request.messages)
    return Usage(prompt_words, len((message.content or "").split()) + len(message.tool_calls))


async def _replay(turn: Turn, request: ModelRequest, delay: float) -> AsyncIterator[ModelEvent]:
    if callable(turn) and not isinstance(turn, (str, AssistantMessage, ModelResponse, list)):
        turn = turn(request)
        if inspect.isawaitable(turn):
            turn = await turn
    if isinstance(turn, BaseException):
        raise turn
    if isinstance(turn, list):
        for event in turn:
            if delay:
                await asyncio.sleep(delay)
            yield event
        return
    if isinstance(turn, str):
        turn = AssistantMessage(turn)
    if isinstance(turn, AssistantMessage):
        turn = ModelResponse(turn, _usage_for(request, turn))
    if not isinstance(turn, ModelResponse):
        raise TypeError(f"not a model turn: {turn!r}")
    for delta in words(turn.message.reasoning or ""):
        if delay:
            await asyncio.sleep(delay)
        yield ModelEvent.reasoning(delta)
    for delta in words(turn.message.content or ""):
        if delay:
            await asyncio.sleep(delay)
        yield ModelEvent.text(delta)
    for call in turn.message.tool_calls:
        yield ModelEvent.tool_call(call)
    yield ModelEvent.completed(turn)


class ScriptedModel:
    """Replays ``turns`` in order, one per model call; a call past the script fails the test.

    It takes text, images and documents (``input_kinds``; narrow it to play a text-only
    model): a test reads what reached it in ``requests``.
    """

    def __init__(
        self,
        turns: Iterable[Turn],
        *,
        delay: float = 0.0,
        retry: RetryOptions | None = None,
        model_name: str = "scripted",
        input_kinds: Iterable[str] = ALL_INPUT_KINDS,
    ) -> None:
        self._turns = list(turns)
        self._next = 0
        self.delay = delay
        self.retry = retry or RetryOptions(max_retries=0)
        self.model_name = model_name
        self.input_kinds = as_input_kinds(input_kinds)
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Turns not yet played."""
        return len(self._turns) - self._next

    def assert_consumed(self) -> None:
        """Fail unless every scripted turn was played."""
        if self.remaining:
            raise AssertionError(f"{self.remaining} scripted turn(s) were never requested")

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        if self._next >= len(self._turns):
            raise AssertionError(
                f"ScriptedModel got call {self._next + 1} but its script has "
                f"{len(self._turns)} turn(s)"
            )
        turn = self._turns[self._next]
        self._next += 1
        return _replay(turn, request, self.delay)


StreamFunction: TypeAlias = Callable[
    [ModelRequest], "AsyncIterator[ModelEvent] | Turn | Awaitable[Turn]"
]


class FunctionModel:
    """Answers each request with ``function(request)``.

    The function may be an async generator of ModelEvents, or return (or await to) a turn.
    Like ``ScriptedModel`` it takes every kind of input unless ``input_kinds`` narrows it.
    """

    def __init__(
        self,
        function: StreamFunction,
        *,
        delay: float = 0.0,
        retry: RetryOptions | None = None,
        model_name: str = "function",
        input_kinds: Iterable[str] = ALL_INPUT_KINDS,
    ) -> None:
        self.function = function
        self.delay = delay
        self.retry = retry or RetryOptions(max_retries=0)
        self.model_name = model_name
        self.input_kinds = as_input_kinds(input_kinds)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        produced = self.function(request)
        if inspect.isasyncgen(produced):
            async for event in produced:
                yield cast(ModelEvent, event)
            return
        if inspect.isawaitable(produced):
            produced = await produced
        async for event in _replay(produced, request, self.delay):
            yield event


def collect_text(events: Sequence[ModelEvent]) -> str:
    """The text of a list of ModelEvents (a test helper)."""
    return "".join(e.delta for e in events if e.kind is ModelEventKind.TEXT)
