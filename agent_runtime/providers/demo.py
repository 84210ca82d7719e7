"""The offline demo model and its two tools.

Deterministic and keyless, so a fresh install answers without any provider:

- an input with the word ``time`` calls ``current_time`` and reports what it returned;
- ``delete NAME`` calls ``delete_file`` (policy ``ask``) and reports whether it was approved;
- an input with the word ``slow`` waits ``slow_seconds`` between words;
- anything else is echoed as ``You said: <input>``; a prompt with images or documents gets one
  more sentence per part, saying what arrived: ``I received an image (image/png, 1234 bytes,
  sha256 1a2b3c4d5e6f).`` (its size and hash from the content store's record, else its bytes;
  a part given by an ``https`` URL is named by its URL, which is never fetched);
- a call with an output schema (structured output) answers JSON that matches it
  (``demo_structured``), its strings the input.

The answer streams one word per text delta, ``token_delay`` seconds apart.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from ..content import MediaPart, TextPart
from ..input_kinds import ALL_INPUT_KINDS
from ..messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, message_text
from ..model import ModelEvent, ModelRequest, ModelResponse, RetryOptions, Usage
from ..testing import words
from ..tools.base import Tool, tool
from .demo_structured import example_value
from .media import OFF_LOOP_BYTES, MediaReader

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


class DemoModel:
    """The offline, deterministic model of the service's default configuration."""

    model_name = "demo"
    provider_name = "demo"
    retry = RetryOptions(max_retries=0)
    input_kinds = ALL_INPUT_KINDS

    def __init__(self, *, token_delay: float = 0.02, slow_seconds: float = 5.0) -> None:
        self.token_delay = token_delay
        self.slow_seconds = slow_seconds

    def _answer(self, request: ModelRequest, received: list[str]) -> tuple[AssistantMessage, float]:
        messages = request.messages
        last_user = _last_user(request)
        prompt = message_text(messages[last_user]) if last_user >= 0 else ""
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
        said = " ".join(["You said:", *filter(None, [prompt, *received])])
        return _final(request, said, prompt), delay

    @staticmethod
    def _call(name: str, arguments: dict[str, str]) -> AssistantMessage:
        return AssistantMessage(None, [ToolCall(f"call_{secrets.token_hex(12)}", name, arguments)])

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        reader = MediaReader(request, self.model_name, self.provider_name)
        last = request.messages[_last_user(request)] if request.messages else None
        received = [
            await _received(part, reader)
            for part in (last.parts if isinstance(last, UserMessage) else ())
            if not isinstance(part, TextPart)
        ]
        message, delay = self._answer(request, received)
        for index, delta in enumerate(words(message.content or "")):
            if delay and index:
                await asyncio.sleep(delay)
            yield ModelEvent.text(delta)
        for call in message.tool_calls:
            yield ModelEvent.tool_call(call)
        prompt_size = sum(len(message_text(m).split()) for m in request.messages)
        usage = Usage(prompt_size, len((message.content or "").split()) + len(message.tool_calls))
        yield ModelEvent.completed(
            ModelResponse(message, usage, "tool_calls" if message.tool_calls else "stop")
        )


def _final(request: ModelRequest, text: str, value: object) -> AssistantMessage:
    """The answer ``text``; under an output schema, JSON matching it whose strings are
    ``value`` (the input, the tool's result)."""
    if request.output_schema is None:
        return AssistantMessage(text)
    answer = example_value(request.output_schema.schema, str(value))
    return AssistantMessage(json.dumps(answer, ensure_ascii=False))


def _last_user(request: ModelRequest) -> int:
    """The index of the conversation's last user message, or -1."""
    return max(
        (i for i, m in enumerate(request.messages) if isinstance(m, UserMessage)), default=-1
    )


async def _received(part: MediaPart, reader: MediaReader) -> str:
    """One sentence on a part that arrived: kind, media type, size and a short hash."""
    article = "an" if part.kind == "image" else "a"
    media_type = reader.media_type(part) or "unknown type"
    url = reader.remote_url(part)
    if url is not None:
        return f"I received {article} {part.kind} ({media_type}, at {url[:80]})."
    size, digest = part.size, part.sha256
    if size is None or digest is None:
        data = await reader.data(part)
        size = len(data)
        digest = await asyncio.to_thread(_sha256, data) if size > OFF_LOOP_BYTES else _sha256(data)
    return f"I received {article} {part.kind} ({media_type}, {size} bytes, sha256 {digest[:12]})."


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
