"""A run's wire events as one OpenAI Responses ``Response`` and its stream events.

A response is one stretch of a run: from its start (or from the answer to a confirmation) to
its terminal event, or to the next confirmation, where the response ends ``incomplete`` with an
``mcp_approval_request`` item while the run waits. ``ResponseBuilder`` reads that stretch's
wire events in order and keeps the ``Response`` object; when streaming, each event also yields
the Responses stream events, numbered from 0 by ``sequence_number``.

The numbering is a pure function of the log: replaying the same events builds the same stream,
so ``GET /responses/{id}?stream=true&starting_after=N`` rebuilds it and sends what follows N.

Wire event → Responses:

- ``reasoning.delta``: a ``reasoning`` item (added, its one ``summary_text`` part added) and
  ``response.reasoning_summary_text.delta``; the item closes at the next other event (the
  text, the tool call it leads to). It carries the reasoning's text as its summary, never the
  provider's signed state (no ``encrypted_content``: that stays on the server);
- ``text.delta``: a ``message`` item (added, its ``output_text`` part added) and
  ``response.output_text.delta``; the item closes before any tool call and at the end;
- ``tool.call.started``: a ``function_call`` item (the agent's own call, already running);
- ``tool.call.completed``: a ``function_call_output`` item (its result or error);
- ``custom`` ``confirmation_requested``: an ``mcp_approval_request`` item; the response ends
  ``response.incomplete``;
- ``usage``: summed into the response's ``usage`` (cached, cache-write and reasoning tokens in
  its details, 0 where the provider reported none);
- ``run.completed`` → ``response.completed``; ``run.failed`` → ``response.failed``;
  ``run.cancelled`` → ``response.incomplete`` with status ``cancelled``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.http.protocols.common import dumps as _dumps

__all__ = [
    "APPROVAL_PREFIX",
    "ResponseBuilder",
    "approval_item_id",
    "format_response_id",
    "parse_response_id",
    "tool_call_of_approval",
]

APPROVAL_PREFIX = "mcpr_"
_RESPONSE_PREFIX = "resp_"
_RUN_PREFIX = "run_"
_WAITING_EVENT = "confirmation_requested"


def format_response_id(run_id: str, after: int = 0) -> str:
    """The id of the response that reads ``run_id``'s events after ``after``."""
    core = run_id.removeprefix(_RUN_PREFIX)
    return f"{_RESPONSE_PREFIX}{core}" if after == 0 else f"{_RESPONSE_PREFIX}{core}_{after}"


def parse_response_id(response_id: str) -> tuple[str, int] | None:
    """``(run_id, after)`` of a response id; None if it is not one of ours."""
    if not response_id.startswith(_RESPONSE_PREFIX):
        return None
    core, _, after = response_id[len(_RESPONSE_PREFIX) :].partition("_")
    if not core or not core.isalnum() or len(core) > 64:
        return None
    if not after:
        return f"{_RUN_PREFIX}{core}", 0
    if not after.isdigit() or len(after) > 18:
        return None
    return f"{_RUN_PREFIX}{core}", int(after)


def approval_item_id(tool_call_id: str) -> str:
    """The ``mcp_approval_request`` item's id for a held tool call."""
    return f"{APPROVAL_PREFIX}{tool_call_id}"


def tool_call_of_approval(approval_request_id: str) -> str | None:
    """The held tool call an ``approval_request_id`` names; None if it is not ours."""
    if not approval_request_id.startswith(APPROVAL_PREFIX):
        return None
    return approval_request_id[len(APPROVAL_PREFIX) :] or None


def _timestamp(ts: Any) -> int:
    """A wire event's ``ts`` as a Unix time in whole seconds (now, if it has none)."""
    if isinstance(ts, str):
        try:
            return int(datetime.fromisoformat(ts).timestamp())
        except ValueError:
            pass
    return int(time.time())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def _usage(counts: Mapping[str, int]) -> dict[str, Any]:
    input_tokens = counts.get("input_tokens", 0)
    output_tokens = counts.get("output_tokens", 0)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": counts.get("cached_input_tokens", 0),
            "cache_write_tokens": counts.get("cache_write_tokens", 0),
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": counts.get("reasoning_tokens", 0)},
        "total_tokens": input_tokens + output_tokens,
    }


class ResponseBuilder:
    """The ``Response`` of one stretch of a run, and (``stream``) its stream events' frames.

    ``starting_after``: stream events numbered up to it are counted but not sent (a resume).
    """

    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created_at: float | None = None,
        session_id: str,
        settings: Mapping[str, Any] | None = None,
        text_format: Mapping[str, Any] | None = None,
        background: bool = False,
        metadata: Mapping[str, Any] | None = None,
        instructions: str | None = None,
        previous_response_id: str | None = None,
        stream: bool = False,
        starting_after: int | None = None,
    ) -> None:
        self.response_id = response_id
        self.status = "queued" if background else "in_progress"
        self.done = False
        self.waiting_for: str | None = None  # the tool call id of the approval it ended on
        self.last_seq = 0  # the wire seq of the last event read
        self._stream = stream
        self._skip_through = -1 if starting_after is None else starting_after
        self._sequence = -1
        self._output: list[dict[str, Any]] = []
        self._text: list[str] = []
        self._message: dict[str, Any] | None = None
        self._summary: list[str] = []
        self._reasoning: dict[str, Any] | None = None
        self._counts: dict[str, int] = {}
        self._error: dict[str, Any] | None = None
        self._completed_at: int | None = None
        # the members the Open Responses schema requires; times in whole seconds, as OpenAI's
        self._response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(created_at if created_at is not None else time.time()),
            "model": model,
            "instructions": instructions,
            "metadata": dict(metadata or {}),
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "background": background,
            "previous_response_id": previous_response_id,
            "conversation": {"id": session_id},
            "text": {"format": dict(text_format or {"type": "text"})},
            "truncation": "disabled",
            # stored, whatever the request said: it can be retrieved (docs/protocols.md)
            "store": True,
            **(settings or {}),
        }

    # --- the Response object ------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The ``Response`` as it stands."""
        output = list(self._output)
        if self._message is not None:  # a message being written: its text so far
            output[-1] = self._message_item("in_progress")
        elif self._reasoning is not None:  # the same for reasoning
            output[-1] = self._reasoning_item("in_progress")
        return {
            **self._response,
            "status": self.status,
            "output": output,
            "error": self._error,
            "incomplete_details": None,
            "completed_at": self._completed_at,
            "usage": _usage(self._counts),
        }

    # --- the stream ---------------------------------------------------------------------------

    def opening(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        created = self._event("response.created", {"response": self.response()})
        self.status = "in_progress"
        return created + self._event("response.in_progress", {"response": self.response()})

    def _event(self, type_: str, fields: dict[str, Any]) -> bytes:
        self._sequence += 1
        if not self._stream or self._sequence <= self._skip_through:
            return b""
        body = _dumps({"type": type_, "sequence_number": self._sequence, **fields})
        return f"event: {type_}\ndata: {body}\n\n".encode()

    # --- reading the run's events -------------------------------------------------------------

    def feed(self, document: Mapping[str, Any]) -> bytes:
        """Take the run's next wire event; the stream frames it makes."""
        if self.done:
            return b""
        self.last_seq = int(document.get("seq", self.last_seq))
        type_ = document["type"]
        data: Mapping[str, Any] = document.get("data") or {}
        if self.status == "queued":
            self.status = "in_progress"
        if type_ == "reasoning.delta":
            return self._reasoning_delta(str(data.get("delta") or ""))
        if type_ == "usage":
            for name in _USAGE_FIELDS:
                value = data.get(name)
                if isinstance(value, int):
                    self._counts[name] = self._counts.get(name, 0) + value
            return b""
        if type_ == "text.delta":
            return self._delta(str(data.get("delta") or ""))
        if type_ == "tool.call.started":
            return self._close_message() + self._function_call(data)
        if type_ == "tool.call.completed":
            return self._close_message() + self._function_output(data)
        if type_ == "custom" and data.get("name") == _WAITING_EVENT:
            return self._close_message() + self._approval(data.get("payload") or {})
        if type_ == "run.completed":
            self._final_text(data.get("output"))
            frames = self._close_message()
            self._completed_at = _timestamp(document.get("ts"))
            return frames + self._finish("completed", "response.completed")
        if type_ == "run.failed":
            frames = self._close_message("incomplete")
            error = data.get("error") or {}
            code = str(error.get("code") or "internal")
            self._error = {
                "code": "rate_limit_exceeded" if code == "queue_timeout" else "server_error",
                "message": f"{code}: {error.get('message') or 'the run failed'}",
                "type": code,
            }
            return frames + self._finish("failed", "response.failed")
        if type_ == "run.cancelled":
            frames = self._close_message("incomplete")
            return frames + self._finish("cancelled", "response.incomplete")
        return b""

    def _final_text(self, output: Any) -> None:
        """A structured answer's text is the run's validated one: an attempt the run retried
        (its text streamed before the check refused it) is not part of it."""
        if not isinstance(output, Mapping) or "structured" not in output:
            return
        content = output.get("content")
        if self._message is not None and isinstance(content, str):
            self._text = [content]

    def _finish(self, status: str, event: str) -> bytes:
        self.status = status
        self.done = True
        return self._event(event, {"response": self.response()})

    def _message_item(self, status: str) -> dict[str, Any]:
        assert self._message is not None
        return {
            **self._message,
            "status": status,
            "content": [{"type": "output_text", "text": "".join(self._text), "annotations": []}],
        }

    def _delta(self, delta: str) -> bytes:
        frames = self._close_reasoning()
        if self._message is None:
            item_id = f"msg_{self.response_id.removeprefix('resp_')}_{self.last_seq}"
            self._message = {"id": item_id, "type": "message", "role": "assistant"}
            self._text = []
            self._output.append({})  # its place; filled in when it closes
            index = len(self._output) - 1
            added = {**self._message, "status": "in_progress", "content": []}
            frames += self._event(
                "response.output_item.added", {"output_index": index, "item": added}
            )
            frames += self._event(
                "response.content_part.added",
                {
                    "item_id": item_id,
                    "output_index": index,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            )
        self._text.append(delta)
        return frames + self._event(
            "response.output_text.delta",
            {
                "item_id": self._message["id"],
                "output_index": len(self._output) - 1,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            },
        )

    def _reasoning_item(self, status: str) -> dict[str, Any]:
        assert self._reasoning is not None
        summary = [{"type": "summary_text", "text": "".join(self._summary)}]
        return {**self._reasoning, "summary": summary, "status": status}

    def _reasoning_delta(self, delta: str) -> bytes:
        frames = b""
        if self._reasoning is None:
            frames = self._close_message()
            item_id = f"rs_{self.response_id.removeprefix('resp_')}_{self.last_seq}"
            self._reasoning = {"id": item_id, "type": "reasoning"}
            self._summary = []
            self._output.append({})  # its place; filled in when it closes
            index = len(self._output) - 1
            added = {**self._reasoning, "summary": [], "status": "in_progress"}
            frames += self._event(
                "response.output_item.added", {"output_index": index, "item": added}
            )
            frames += self._event(
                "response.reasoning_summary_part.added",
                {
                    "item_id": item_id,
                    "output_index": index,
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""},
                },
            )
        self._summary.append(delta)
        return frames + self._event(
            "response.reasoning_summary_text.delta",
            {
                "item_id": self._reasoning["id"],
                "output_index": len(self._output) - 1,
                "summary_index": 0,
                "delta": delta,
            },
        )

    def _close_reasoning(self, status: str = "completed") -> bytes:
        if self._reasoning is None:
            return b""
        item = self._reasoning_item(status)
        self._reasoning = None
        index = len(self._output) - 1
        self._output[index] = item
        part = item["summary"][0]
        place = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        frames = self._event(
            "response.reasoning_summary_text.done", {**place, "text": part["text"]}
        )
        frames += self._event("response.reasoning_summary_part.done", {**place, "part": part})
        return frames + self._event(
            "response.output_item.done", {"output_index": index, "item": item}
        )

    def _close_message(self, status: str = "completed") -> bytes:
        """Close the open item: the message being written, or the reasoning before it."""
        if self._message is None:
            return self._close_reasoning(status)
        item = self._message_item(status)
        self._message = None
        index = len(self._output) - 1
        self._output[index] = item
        text = item["content"][0]
        place = {"item_id": item["id"], "output_index": index, "content_index": 0}
        frames = self._event(
            "response.output_text.done", {**place, "text": text["text"], "logprobs": []}
        )
        frames += self._event("response.content_part.done", {**place, "part": text})
        return frames + self._event(
            "response.output_item.done", {"output_index": index, "item": item}
        )

    def _item(self, type_: str, index: int, item: dict[str, Any]) -> bytes:
        return self._event(type_, {"output_index": index, "item": item})

    def _add_item(self, item: dict[str, Any]) -> bytes:
        self._output.append(item)
        index = len(self._output) - 1
        frames = self._item("response.output_item.added", index, item)
        return frames + self._event(
            "response.output_item.done", {"output_index": index, "item": item}
        )

    def _function_call(self, data: Mapping[str, Any]) -> bytes:
        call_id = str(data.get("tool_call_id") or "")
        arguments = _text(data.get("arguments") or {})
        item = {
            "id": f"fc_{call_id}",
            "type": "function_call",
            "call_id": call_id,
            "name": str(data.get("name") or ""),
            "arguments": arguments,
            "status": "in_progress",
        }
        self._output.append(item)
        index = len(self._output) - 1
        place = {"item_id": item["id"], "output_index": index}
        frames = self._event(
            "response.output_item.added", {"output_index": index, "item": {**item, "arguments": ""}}
        )
        frames += self._event(
            "response.function_call_arguments.delta", {**place, "delta": arguments}
        )
        frames += self._event(
            "response.function_call_arguments.done",
            {**place, "arguments": arguments, "name": item["name"]},
        )
        item["status"] = "completed"
        return frames + self._event(
            "response.output_item.done", {"output_index": index, "item": item}
        )

    def _function_output(self, data: Mapping[str, Any]) -> bytes:
        call_id = str(data.get("tool_call_id") or "")
        output = data.get("error") if data.get("is_error") else data.get("result")
        return self._add_item(
            {
                "id": f"fco_{call_id}",
                "type": "function_call_output",
                "call_id": call_id,
                "name": str(data.get("name") or ""),
                "output": _text(output if output is not None else ""),
                "status": "completed",
            }
        )

    def _approval(self, payload: Mapping[str, Any]) -> bytes:
        call_id = str(payload.get("tool_call_id") or "")
        self.waiting_for = call_id
        frames = self._add_item(
            {
                "id": approval_item_id(call_id),
                "type": "mcp_approval_request",
                "server_label": self._response["model"],
                "name": str(payload.get("tool") or ""),
                "arguments": _text(payload.get("arguments") or {}),
            }
        )
        return frames + self._finish("incomplete", "response.incomplete")
