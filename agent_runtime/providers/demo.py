"""The offline demo model and its two tools.

Deterministic and keyless, so a fresh install answers without any provider:

- an input with the word ``time`` calls ``current_time`` and reports what it returned;
- ``delete NAME`` calls ``delete_file`` (policy ``ask``) and reports whether it was approved;
- an input with the word ``slow`` waits ``slow_seconds`` between words;
- anything else is echoed as ``You said: <input>``;
- a call with an output schema (structured output) answers JSON that matches it
  (``demo_structured``), its strings the input.

The answer streams one word per text delta, ``token_delay`` seconds apart.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from ..messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ..model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from ..testing import words
from ..tools.base import Tool, tool
from .demo_structured import example_value

__all__ = ["DemoModel", "demo_tools"]

_TIME = re.compile(r"\btime\b", re.IGNORECASE)
_SLOW = re.compile(r"\bslow\b", re.IGNORECASE)
_DELETE = re.compile(r"\bdelete\s+(\S+)", re.IGNORECASE)


@tool(policy="allow")
def current_time() -> str:
    """Return the current time in UTC, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@tool(policy="ask")
def delete_file(path: str) -> str:
    """Delete the file at ``path`` (a demonstration: no file is touched)."""
    return f"Deleted {path}"


def demo_tools() -> list[Tool]:
    """The demo model's tools: ``current_time`` (allow) and ``delete_file`` (ask)."""
    return [current_time, delete_file]


def _final(request: ModelRequest, text: str, value: object) -> AssistantMessage:
    """The answer ``text``; under an output schema, JSON matching it whose strings are
    ``value`` (the input, the tool's result)."""
    if request.output_schema is None:
        return AssistantMessage(text)
    answer = example_value(request.output_schema.schema, str(value))
    return AssistantMessage(json.dumps(answer, ensure_ascii=False))


class DemoModel:
    """The offline, deterministic model of the service's default configuration."""

    model_name = "demo"
    provider_name = "demo"
    retry = RetryOptions(max_retries=0)

    def __init__(self, *, token_delay: float = 0.02, slow_seconds: float = 5.0) -> None:
        self.token_delay = token_delay
        self.slow_seconds = slow_seconds

    def _answer(self, request: ModelRequest) -> tuple[AssistantMessage, float]:
        messages = request.messages
        last_user = max(
            (i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1
        )
        prompt = str(messages[last_user].content or "") if last_user >= 0 else ""
        results = [m for m in messages[last_user + 1 :] if isinstance(m, ToolMessage)]
        delay = self.slow_seconds if _SLOW.search(prompt) else self.token_delay
        deletion = _DELETE.search(prompt)
        if deletion is not None:
            name = deletion.group(1)
            if not results:
                return self._call("delete_file", {"path": name}), delay
            if results[-1].is_error:
                text = f"I did not delete {name}: the request was not approved."
                return _final(request, text, text), delay
            return _final(request, f"Deleted {name} as you asked.", name), delay
        if _TIME.search(prompt):
            if not results:
                return self._call("current_time", {}), delay
            return _final(
                request, f"The time is {results[-1].content}.", results[-1].content
            ), delay
        return _final(request, f"You said: {prompt}", prompt), delay

    @staticmethod
    def _call(name: str, arguments: dict[str, str]) -> AssistantMessage:
        return AssistantMessage(None, [ToolCall(f"call_{secrets.token_hex(12)}", name, arguments)])

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        message, delay = self._answer(request)
        for index, delta in enumerate(words(message.content or "")):
            if delay and index:
                await asyncio.sleep(delay)
            yield ModelEvent.text(delta)
        for call in message.tool_calls:
            yield ModelEvent.tool_call(call)
        prompt_size = sum(
            len(str(getattr(m, "content", "") or "").split()) for m in request.messages
        )
        usage = Usage(prompt_size, len((message.content or "").split()) + len(message.tool_calls))
        yield ModelEvent.completed(
            ModelResponse(message, usage, "tool_calls" if message.tool_calls else "stop")
        )
