"""A run's event log folded into what LangGraph clients read: the messages the run added so
far, the interrupt it waits on, and the stream parts of each stream mode.

A confirmation is an interrupt in Agent Inbox's ``HumanInterrupt`` shape: ``action_request``
names the tool and its arguments, ``config`` says what may be answered (accept, ignore, a reply
in the call's place, which the model gets as the call's result while the tool does not run; an
edit of the arguments where the tool allows it), ``description`` is the question. The
interrupt's id is the tool call's id. An edit shows on the AI message's ``tool_calls`` once the
run takes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.http.protocols.langgraph.messages import (
    ai_content,
    ai_message,
    human_message,
    message_id,
    tool_message,
)

__all__ = ["RunFold", "StreamPart", "interrupt_of"]

StreamPart = tuple[str, Any]
"""``(event name, data)`` of one LangGraph stream part."""


def interrupt_of(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A ``confirmation_requested`` payload as a LangGraph interrupt."""
    return {
        "id": str(payload.get("tool_call_id") or ""),
        "value": {
            "action_request": {
                "action": str(payload.get("tool") or ""),
                "args": payload.get("arguments") or {},
            },
            "config": {
                "allow_accept": True,
                "allow_ignore": True,
                "allow_respond": True,
                "allow_edit": payload.get("editable") is True,
            },
            "description": str(payload.get("question") or ""),
        },
    }


@dataclass
class _OpenAI:
    id: str
    content: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        return ai_message("".join(self.content), self.id, self.calls, "".join(self.reasoning))


class RunFold:
    """One run's log, read in order, as messages, an interrupt and stream parts.

    ``base`` is the thread's messages before the run (for ``values``); ``prompt`` the run's
    input text (its human message, first of what the run adds).
    """

    def __init__(self, run_id: str, thread_id: str, base: list[dict[str, Any]], prompt: str):
        self.run_id = run_id
        self.thread_id = thread_id
        self.base = base
        self.added: list[dict[str, Any]] = [human_message(prompt, message_id(run_id, 0))]
        self.interrupts: dict[str, dict[str, Any]] = {}
        # the seq of the event that asked each pending interrupt
        self.interrupt_seqs: dict[str, int] = {}
        self.ended = False
        self.error: dict[str, Any] | None = None
        self.cancelled: str | None = None
        self._open: _OpenAI | None = None

    def waits_since(self, after: int) -> bool:
        """True when an interrupt asked after ``after`` is pending."""
        return any(seq > after for seq in self.interrupt_seqs.values())

    @property
    def values(self) -> dict[str, Any]:
        """The thread's state values now."""
        messages = [*self.base, *self.added]
        if self._open is not None:
            messages.append(self._open.message())
        return {"messages": messages}

    def _meta(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "thread_id": self.thread_id, "langgraph_node": "agent"}

    def _close_ai(self, parts: list[StreamPart]) -> None:
        if self._open is None:
            return
        message = self._open.message()
        self._open = None
        self.added.append(message)
        parts.append(("updates", {"agent": {"messages": [message]}}))
        parts.append(("values", self.values))

    def _ai(self) -> _OpenAI:
        if self._open is None:
            self._open = _OpenAI(message_id(self.run_id, len(self.added)))
        return self._open

    def feed(self, document: Mapping[str, Any]) -> list[StreamPart]:
        """Take the next event of the run's log; the stream parts it makes (every mode's)."""
        kind = document.get("type")
        data = document.get("data")
        data = data if isinstance(data, dict) else {}
        parts: list[StreamPart] = []
        if kind == "run.started":
            parts.append(("values", self.values))
        elif kind == "text.delta":
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                ai = self._ai()
                ai.content.append(delta)
                # after reasoning, the text is a block too, so that the chunks merge into the
                # message's content (``ai_content``)
                content: str | list[dict[str, Any]] = delta
                if ai.reasoning:
                    content = [{"type": "text", "text": delta, "index": 1}]
                parts.append(("messages", [self._chunk(ai.id, content), self._meta()]))
        elif kind == "reasoning.delta":
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                ai = self._ai()
                ai.reasoning.append(delta)
                content = ai_content("", delta)
                parts.append(("messages", [self._chunk(ai.id, content), self._meta()]))
        elif kind == "tool.call.started":
            ai = self._ai()
            call = {
                "id": str(data.get("tool_call_id") or ""),
                "name": str(data.get("name") or ""),
                "args": data.get("arguments") or {},
            }
            ai.calls.append(call)
            chunk = self._chunk(ai.id, "")
            chunk["tool_call_chunks"] = [
                {
                    "id": call["id"],
                    "name": call["name"],
                    "args": json.dumps(call["args"], ensure_ascii=False),
                    "index": len(ai.calls) - 1,
                    "type": "tool_call_chunk",
                }
            ]
            parts.append(("messages", [chunk, self._meta()]))
        elif kind == "tool.call.completed":
            self._close_ai(parts)
            if data.get("edited") is True:
                self._edited(data.get("tool_call_id"), data.get("arguments"))
            result = data.get("error") if data.get("is_error") else data.get("result")
            message = tool_message(
                result if result is not None else "",
                message_id(self.run_id, len(self.added)),
                tool_call_id=str(data.get("tool_call_id") or ""),
                name=str(data.get("name") or ""),
                is_error=bool(data.get("is_error")),
            )
            self.added.append(message)
            parts.append(("updates", {"tools": {"messages": [message]}}))
            parts.append(("values", self.values))
        elif kind == "custom":
            parts.extend(self._custom(data, int(document.get("seq") or 0)))
        elif kind == "run.resumed":
            # the model call cut by the hand-over is done again: its text so far is superseded
            self._open = None
        elif kind == "run.completed":
            self._close_ai(parts)
            self.ended = True
            if not parts:
                parts.append(("values", self.values))
        elif kind == "run.failed":
            self._open = None
            self.ended = True
            error = data.get("error") if isinstance(data.get("error"), dict) else {}
            self.error = error
            parts.append(
                (
                    "error",
                    {
                        "error": str((error or {}).get("code") or "internal"),
                        "message": str((error or {}).get("message") or "the run failed"),
                    },
                )
            )
        elif kind == "run.cancelled":
            self._close_ai(parts)
            self.ended = True
            self.cancelled = str(data.get("reason") or "cancel_requested")
        return parts

    def _custom(self, data: Mapping[str, Any], seq: int) -> list[StreamPart]:
        name = data.get("name")
        payload = data.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        call_id = payload.get("tool_call_id")
        parts: list[StreamPart] = []
        if name == "confirmation_requested" and isinstance(call_id, str):
            self._close_ai(parts)
            interrupt = interrupt_of(payload)
            self.interrupts[call_id] = interrupt
            self.interrupt_seqs[call_id] = seq
            parts.append(("updates", {"__interrupt__": [interrupt]}))
            parts.append(("values", {**self.values, "__interrupt__": [interrupt]}))
            return parts
        if name == "confirmation_resolved" and isinstance(call_id, str):
            self.interrupts.pop(call_id, None)
            self.interrupt_seqs.pop(call_id, None)
            if payload.get("edited") is True:
                self._edited(call_id, payload.get("arguments"))
        parts.append(("custom", {"name": name, "payload": payload}))
        return parts

    def _edited(self, call_id: object, arguments: object) -> None:
        """A person approved the call with these arguments: the AI message shows them."""
        if not isinstance(call_id, str) or not isinstance(arguments, dict):
            return
        for index in range(len(self.added) - 1, -1, -1):
            message = self.added[index]
            calls = message.get("tool_calls") if message.get("type") == "ai" else None
            if any(call.get("id") == call_id for call in calls or ()):
                # a new message: the parts already made keep what they said then
                self.added[index] = {
                    **message,
                    "tool_calls": [
                        {**call, "args": arguments} if call.get("id") == call_id else call
                        for call in calls or ()
                    ],
                }
                return

    def _chunk(self, id_: str, content: str | list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "type": "AIMessageChunk",
            "content": content,
            "id": id_,
            "name": None,
            "tool_calls": [],
            "tool_call_chunks": [],
            "invalid_tool_calls": [],
            "additional_kwargs": {},
            "response_metadata": {},
            "usage_metadata": None,
        }
