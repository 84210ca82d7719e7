"""A model that reasons before it answers, reached by a ``python:`` model spec.

``model = "python:tests.fakes.reasoning_models:thinker"`` behaves as the demo model (``time``,
``delete NAME``, ``slow``, else ``You said: ...``) and, before each answer or tool call,
streams its reasoning as reasoning deltas, one word each: ``Thinking about "<input>", step N.``
(N counts the model calls of the run so far). Each call's response carries that reasoning
text, a signed reasoning state whose signature starts with ``SIGNED-`` (it must never reach
a client) and usage with every detail: ``cached_input_tokens`` 80 and ``cache_write_tokens``
20 of 100 more input tokens (a cached system prompt), and ``reasoning_tokens`` (the reasoning's
words, counted in ``output_tokens`` too). Deltas are ``AGENT_DEMO_TOKEN_DELAY`` seconds apart.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator

from agent_runtime.messages import AssistantMessage, ReasoningState, ToolMessage, UserMessage
from agent_runtime.model import (
    ModelEvent,
    ModelEventKind,
    ModelRequest,
    ModelResponse,
    RetryOptions,
    Usage,
)
from agent_runtime.providers.demo import DemoModel
from agent_runtime.testing import words

__all__ = ["SIGNATURE_PREFIX", "Thinker", "thinker"]

SIGNATURE_PREFIX = "SIGNED-"
CACHED_TOKENS = 80
CACHE_WRITE_TOKENS = 20


def _thought(request: ModelRequest) -> str:
    prompt, steps = "", 1
    for message in request.messages:
        if isinstance(message, UserMessage):
            prompt, steps = message.text, 1
        elif isinstance(message, ToolMessage):
            steps += 1
    return f'Thinking about "{prompt}", step {steps}.'


class Thinker:
    """The demo model, reasoning first (see the module's docstring)."""

    model_name = "thinker"
    provider_name = "thinker"
    retry = RetryOptions(max_retries=0)

    def __init__(self, token_delay: float = 0.0) -> None:
        self._delay = token_delay
        self._demo = DemoModel(token_delay=token_delay, slow_seconds=token_delay)
        self.requests: list[ModelRequest] = []  # every call's request, for tests to read

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        thought = _thought(request)
        pieces = words(thought)
        for index, piece in enumerate(pieces):
            if self._delay and index:
                await asyncio.sleep(self._delay)
            yield ModelEvent.reasoning(piece)
        async for event in self._demo.stream(request):
            if event.kind is not ModelEventKind.COMPLETED or event.response is None:
                yield event
                continue
            answer = event.response
            given = answer.usage or Usage()
            signature = SIGNATURE_PREFIX + hashlib.sha256(thought.encode()).hexdigest()[:16]
            message = AssistantMessage(
                answer.message.content,
                answer.message.tool_calls,
                reasoning=thought,
                reasoning_state=ReasoningState(
                    "thinker",
                    ({"type": "thinking", "thinking": thought, "signature": signature},),
                ),
            )
            usage = Usage(
                given.input_tokens + CACHED_TOKENS + CACHE_WRITE_TOKENS,
                given.output_tokens + len(pieces),
                self.model_name,
                cached_input_tokens=CACHED_TOKENS,
                cache_write_tokens=CACHE_WRITE_TOKENS,
                reasoning_tokens=len(pieces),
            )
            yield ModelEvent.completed(ModelResponse(message, usage, answer.stop_reason))


def thinker() -> Thinker:
    """The thinking model described above."""
    return Thinker(float(os.environ.get("AGENT_DEMO_TOKEN_DELAY") or 0))
