"""The OpenAI Chat Completions wire: streamed chunks, whole answers and error bodies.

Reasoning is streamed as ``reasoning_content`` deltas (DeepSeek's and vLLM's field; OpenAI's
own models show none on this wire). Usage details go in ``prompt_tokens_details.cached_tokens``
and ``completion_tokens_details.reasoning_tokens``; ``prompt_tokens`` include the cached ones.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from .behaviours import FakeToolCall, Reasoning, UsageDetails
from .frames import ERROR_TYPES, Frame
from .recording import RecordedRequest

__all__ = ["OpenAIWire"]


class OpenAIWire:
    """Renders answers as OpenAI Chat Completions: ``data:`` chunks, then ``[DONE]``."""

    def __init__(self, request: RecordedRequest) -> None:
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        options = body.get("stream_options") or {}
        self.include_usage = bool(options.get("include_usage"))
        self.id = f"chatcmpl-{secrets.token_hex(6)}"

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(payload)}\n\n".encode()

    def preamble(self) -> list[Frame]:
        return [Frame(self._chunk({"role": "assistant", "content": ""}))]

    def text(self, piece: str) -> Frame:
        return Frame(self._chunk({"content": piece}), content=True)

    def reasoning(self, item: Reasoning) -> list[Frame]:
        return [
            Frame(self._chunk({"reasoning_content": piece}), content=True)
            for piece in item.pieces()
        ]

    def tool_call(self, index: int, call: FakeToolCall, call_id: str) -> list[Frame]:
        start = {
            "tool_calls": [
                {
                    "index": index,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
            ]
        }
        frames = [Frame(self._chunk(start))]
        for piece in call.argument_pieces():
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            frames.append(Frame(self._chunk(delta), content=True))
        return frames

    def finish(
        self, reason: str, usage: tuple[int, int], details: UsageDetails | None = None
    ) -> list[Frame]:
        frames = [Frame(self._chunk({}, reason))]
        if self.include_usage:
            payload = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [],
                "usage": _usage(usage, details),
            }
            frames.append(Frame(f"data: {json.dumps(payload)}\n\n".encode()))
        frames.append(Frame(b"data: [DONE]\n\n"))
        return frames

    def keepalive(self) -> Frame:
        return Frame(b": ping\n\n")

    def error_event(self, error_type: str, message: str) -> Frame:
        payload = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
        return Frame(f"data: {json.dumps(payload)}\n\n".encode())

    def error_body(self, status_code: int, message: str, error_type: str | None) -> bytes:
        kind = error_type or ERROR_TYPES.get(status_code, "server_error")
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return json.dumps(body).encode()

    def whole(
        self,
        text: str,
        calls: list[tuple[FakeToolCall, str]],
        usage: tuple[int, int],
        reasoning: Sequence[Reasoning] = (),
        details: UsageDetails | None = None,
    ) -> Any:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if reasoning:
            message["reasoning_content"] = "".join(item.text for item in reasoning)
        if calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.argument_text()},
                }
                for call, call_id in calls
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": _usage(usage, details),
        }


def _usage(usage: tuple[int, int], details: UsageDetails | None) -> dict[str, Any]:
    counted: dict[str, Any] = {
        "prompt_tokens": usage[0],
        "completion_tokens": usage[1],
        "total_tokens": usage[0] + usage[1],
    }
    if details is not None and details.cached is not None:
        counted["prompt_tokens_details"] = {"cached_tokens": details.cached}
        if details.cache_write is not None:
            counted["prompt_tokens_details"]["cache_write_tokens"] = details.cache_write
    if details is not None and details.reasoning is not None:
        counted["completion_tokens_details"] = {"reasoning_tokens": details.reasoning}
    return counted
