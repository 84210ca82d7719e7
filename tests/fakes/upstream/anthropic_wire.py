"""The Anthropic Messages wire: streamed events, whole answers and error bodies.

Reasoning is a ``thinking`` block (its text in ``thinking_delta``s, then one
``signature_delta``) or a ``redacted_thinking`` block (its ``data`` in the block's start).
Cache counts go in ``message_start``'s usage (``cache_read_input_tokens``,
``cache_creation_input_tokens``) beside ``input_tokens``, which count the uncached input only;
thinking tokens in ``message_delta``'s ``output_tokens_details``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from .behaviours import FakeToolCall, Reasoning, UsageDetails
from .frames import ERROR_TYPES, Frame
from .recording import RecordedRequest

__all__ = ["AnthropicWire"]


class AnthropicWire:
    """Renders answers as Anthropic Messages: named events, ``message_start`` to the stop."""

    def __init__(self, request: RecordedRequest) -> None:
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        self.id = f"msg_{secrets.token_hex(6)}"
        self.block = -1
        self.text_open = False
        self.input_tokens = 11
        self.details: UsageDetails | None = None

    @staticmethod
    def _event(name: str, payload: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()

    def set_usage(self, usage: tuple[int, int] | None, details: UsageDetails | None = None) -> None:
        if usage is not None:
            self.input_tokens = usage[0]
        self.details = details

    def preamble(self) -> list[Frame]:
        start = {
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 1}
                | self._cache(self.details),
            },
        }
        return [
            Frame(self._event("message_start", start)),
            Frame(self._event("ping", {"type": "ping"})),
        ]

    @staticmethod
    def _cache(details: UsageDetails | None) -> dict[str, int]:
        if details is None:
            return {}
        counts = {
            "cache_read_input_tokens": details.cached,
            "cache_creation_input_tokens": details.cache_write,
        }
        return {name: value for name, value in counts.items() if value is not None}

    def reasoning(self, item: Reasoning) -> list[Frame]:
        frames = self._close_block() if self.text_open else []
        self.block += 1
        start: dict[str, Any] = {"type": "content_block_start", "index": self.block}
        if item.redacted is not None:
            start["content_block"] = {"type": "redacted_thinking", "data": item.redacted}
            frames.append(Frame(self._event("content_block_start", start)))
            frames.extend(self._close_block())
            return frames
        start["content_block"] = {"type": "thinking", "thinking": "", "signature": ""}
        frames.append(Frame(self._event("content_block_start", start)))
        for piece in item.pieces():
            delta = {
                "type": "content_block_delta",
                "index": self.block,
                "delta": {"type": "thinking_delta", "thinking": piece},
            }
            frames.append(Frame(self._event("content_block_delta", delta), content=True))
        signature = {
            "type": "content_block_delta",
            "index": self.block,
            "delta": {"type": "signature_delta", "signature": item.signature_value},
        }
        frames.append(Frame(self._event("content_block_delta", signature)))
        frames.extend(self._close_block())
        return frames

    def _open_text(self) -> list[Frame]:
        if self.text_open:
            return []
        self.block += 1
        self.text_open = True
        block = {"type": "content_block_start", "index": self.block}
        block["content_block"] = {"type": "text", "text": ""}
        return [Frame(self._event("content_block_start", block))]

    def _close_block(self) -> list[Frame]:
        self.text_open = False
        stop = {"type": "content_block_stop", "index": self.block}
        return [Frame(self._event("content_block_stop", stop))]

    def text(self, piece: str) -> list[Frame]:
        frames = self._open_text()
        delta = {
            "type": "content_block_delta",
            "index": self.block,
            "delta": {"type": "text_delta", "text": piece},
        }
        frames.append(Frame(self._event("content_block_delta", delta), content=True))
        return frames

    def tool_call(self, call: FakeToolCall, call_id: str) -> list[Frame]:
        frames = self._close_block() if self.text_open else []
        self.block += 1
        start = {
            "type": "content_block_start",
            "index": self.block,
            "content_block": {"type": "tool_use", "id": call_id, "name": call.name, "input": {}},
        }
        frames.append(Frame(self._event("content_block_start", start)))
        for piece in call.argument_pieces():
            delta = {
                "type": "content_block_delta",
                "index": self.block,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            frames.append(Frame(self._event("content_block_delta", delta), content=True))
        frames.extend(self._close_block())
        return frames

    def finish(
        self, reason: str, usage: tuple[int, int], details: UsageDetails | None = None
    ) -> list[Frame]:
        frames = self._close_block() if self.text_open else []
        counted: dict[str, Any] = {"output_tokens": usage[1]}
        if details is not None and details.reasoning is not None:
            counted["output_tokens_details"] = {"thinking_tokens": details.reasoning}
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": counted,
        }
        frames.append(Frame(self._event("message_delta", delta)))
        frames.append(Frame(self._event("message_stop", {"type": "message_stop"})))
        return frames

    def keepalive(self) -> Frame:
        return Frame(self._event("ping", {"type": "ping"}))

    def error_event(self, error_type: str, message: str) -> Frame:
        payload = {"type": "error", "error": {"type": error_type, "message": message}}
        return Frame(self._event("error", payload))

    def error_body(self, status_code: int, message: str, error_type: str | None) -> bytes:
        kind = error_type or ERROR_TYPES.get(status_code, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def whole(
        self,
        text: str,
        calls: list[tuple[FakeToolCall, str]],
        usage: tuple[int, int],
        reasoning: Sequence[Reasoning] = (),
        details: UsageDetails | None = None,
    ) -> Any:
        content: list[dict[str, Any]] = [
            {"type": "redacted_thinking", "data": item.redacted}
            if item.redacted is not None
            else {"type": "thinking", "thinking": item.text, "signature": item.signature_value}
            for item in reasoning
        ]
        if text:
            content.append({"type": "text", "text": text})
        content.extend(
            {"type": "tool_use", "id": call_id, "name": call.name, "input": json.loads(raw)}
            for call, call_id in calls
            for raw in [call.argument_text() or "{}"]
        )
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]} | self._cache(details),
        }
