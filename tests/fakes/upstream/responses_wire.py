"""The OpenAI Responses wire (``POST /v1/responses``): streamed events, whole answers, errors.

A stream is ``response.created``, ``response.in_progress``, then one output item after another
(each ``response.output_item.added`` ... ``response.output_item.done``), then
``response.completed`` carrying the whole response with its usage. Items: ``reasoning``
(summary deltas; ``encrypted_content`` in its ``output_item.done``, as with ``store: false``
and ``include: ["reasoning.encrypted_content"]``), ``message`` (``output_text`` deltas) and
``function_call`` (argument deltas). Every event names itself (``event:``) and carries a
rising ``sequence_number``, as the real API's do; the shapes are those of the ``openai``
SDK's types (``openai.types.responses``).
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

__all__ = ["ResponsesWire"]


class ResponsesWire:
    """Renders answers as OpenAI Responses stream events."""

    def __init__(self, request: RecordedRequest) -> None:
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        self.id = f"resp_{secrets.token_hex(8)}"
        self.created_at = int(time.time())
        self.sequence = -1
        self.output: list[dict[str, Any]] = []
        self.text_item: dict[str, Any] | None = None
        self.text_pieces: list[str] = []

    def _event(self, name: str, payload: dict[str, Any]) -> bytes:
        self.sequence += 1
        data = {"type": name, **payload, "sequence_number": self.sequence}
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "text": {"format": {"type": "text"}},
            "usage": usage,
        }

    def preamble(self) -> list[Frame]:
        response = self._response("in_progress", [], None)
        return [
            Frame(self._event("response.created", {"response": response})),
            Frame(self._event("response.in_progress", {"response": response})),
        ]

    # items --------------------------------------------------------------------------------------

    def _added(self, item: dict[str, Any]) -> Frame:
        payload = {"output_index": len(self.output), "item": item}
        return Frame(self._event("response.output_item.added", payload))

    def _done(self, item: dict[str, Any]) -> Frame:
        payload = {"output_index": len(self.output), "item": item}
        frame = Frame(self._event("response.output_item.done", payload))
        self.output.append(item)
        return frame

    def reasoning(self, item: Reasoning) -> list[Frame]:
        frames = self._close_text()
        index = len(self.output)
        done = reasoning_item(item)
        frames.append(self._added({"id": done["id"], "type": "reasoning", "summary": []}))
        if item.redacted is None and item.text:
            where = {"item_id": done["id"], "output_index": index, "summary_index": 0}
            part = {"type": "summary_text", "text": ""}
            frames.append(
                Frame(self._event("response.reasoning_summary_part.added", {**where, "part": part}))
            )
            for piece in item.pieces():
                delta = {**where, "delta": piece}
                frames.append(
                    Frame(self._event("response.reasoning_summary_text.delta", delta), content=True)
                )
            text = {**where, "text": item.text}
            frames.append(Frame(self._event("response.reasoning_summary_text.done", text)))
            part = {"type": "summary_text", "text": item.text}
            frames.append(
                Frame(self._event("response.reasoning_summary_part.done", {**where, "part": part}))
            )
        frames.append(self._done(done))
        return frames

    def text(self, piece: str) -> list[Frame]:
        frames: list[Frame] = []
        if self.text_item is None:
            self.text_item = {
                "id": f"msg_{secrets.token_hex(8)}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            self.text_pieces = []
            frames.append(self._added(self.text_item))
            added = {
                **self._text_place(),
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            }
            frames.append(Frame(self._event("response.content_part.added", added)))
        self.text_pieces.append(piece)
        delta = {**self._text_place(), "delta": piece, "logprobs": []}
        frames.append(Frame(self._event("response.output_text.delta", delta), content=True))
        return frames

    def _text_place(self) -> dict[str, Any]:
        assert self.text_item is not None
        return {
            "item_id": self.text_item["id"],
            "output_index": len(self.output),
            "content_index": 0,
        }

    def _close_text(self) -> list[Frame]:
        if self.text_item is None:
            return []
        text = "".join(self.text_pieces)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        frames = [
            Frame(
                self._event(
                    "response.output_text.done",
                    {**self._text_place(), "text": text, "logprobs": []},
                )
            ),
            Frame(self._event("response.content_part.done", {**self._text_place(), "part": part})),
        ]
        item = {**self.text_item, "status": "completed", "content": [part]}
        self.text_item = None
        frames.append(self._done(item))
        return frames

    def tool_call(self, call: FakeToolCall, call_id: str) -> list[Frame]:
        frames = self._close_text()
        item_id = f"fc_{secrets.token_hex(8)}"
        item = {
            "id": item_id,
            "type": "function_call",
            "call_id": call_id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        frames.append(self._added(item))
        where = {"item_id": item_id, "output_index": len(self.output)}
        for piece in call.argument_pieces():
            frames.append(
                Frame(
                    self._event(
                        "response.function_call_arguments.delta", {**where, "delta": piece}
                    ),
                    content=True,
                )
            )
        arguments = call.argument_text()
        frames.append(
            Frame(
                self._event(
                    "response.function_call_arguments.done",
                    {**where, "name": call.name, "arguments": arguments},
                )
            )
        )
        frames.append(self._done({**item, "arguments": arguments, "status": "completed"}))
        return frames

    def finish(
        self, reason: str, usage: tuple[int, int], details: UsageDetails | None = None
    ) -> list[Frame]:
        frames = self._close_text()
        response = self._response("completed", list(self.output), _usage(usage, details))
        frames.append(Frame(self._event("response.completed", {"response": response})))
        return frames

    # the rest of a wire ---------------------------------------------------------------------------

    def keepalive(self) -> Frame:
        return Frame(b": ping\n\n")

    def error_event(self, error_type: str, message: str) -> Frame:
        return Frame(self._event("error", {"code": error_type, "message": message, "param": None}))

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
        output: list[dict[str, Any]] = [reasoning_item(item) for item in reasoning]
        if text:
            output.append(
                {
                    "id": f"msg_{secrets.token_hex(8)}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                    ],
                }
            )
        output.extend(
            {
                "id": f"fc_{secrets.token_hex(8)}",
                "type": "function_call",
                "call_id": call_id,
                "name": call.name,
                "arguments": call.argument_text(),
                "status": "completed",
            }
            for call, call_id in calls
        )
        return self._response("completed", output, _usage(usage, details))


def reasoning_item(item: Reasoning) -> dict[str, Any]:
    """The whole ``reasoning`` output item of ``item``, as ``output_item.done`` carries it."""
    summary = (
        [{"type": "summary_text", "text": item.text}] if item.redacted is None and item.text else []
    )
    return {
        "id": item.item_id,
        "type": "reasoning",
        "summary": summary,
        "encrypted_content": item.encrypted_value,
        "status": "completed",
    }


def _usage(usage: tuple[int, int], details: UsageDetails | None) -> dict[str, Any]:
    cached = details.cached if details is not None and details.cached is not None else 0
    reasoning = details.reasoning if details is not None and details.reasoning is not None else 0
    written = details.cache_write if details is not None and details.cache_write is not None else 0
    input_details = {"cached_tokens": cached, "cache_write_tokens": written}
    return {
        "input_tokens": usage[0],
        "input_tokens_details": input_details,
        "output_tokens": usage[1],
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage[0] + usage[1],
    }
