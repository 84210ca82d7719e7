"""Context compaction: keeping the conversation a model sees within bounds.

Before each model call of a run, the runtime applies two steps to the run's messages:

1. the run's ``ContextCompactor``, if any (run option ``context_compactor=`` or the agent's
   constructor default). ``LlmCompactor`` summarises older messages through a model;
2. the agent's ``max_history_messages`` bound (default 200), which drops the oldest whole turns.

The result becomes the run's working history, so a summary made in one model call is not made
again in the next. What the conversation store keeps is unchanged: it still receives every new
message of the run, and the next run compacts its history afresh.

Both steps keep the start of the history still for as long as they can, since a provider's
prompt cache holds the conversation's prefix: a change near the start costs every later token
a cache miss. The summary replaces the older part once, then stays until the history grows
past ``trigger_messages`` again; the bound drops the oldest turns in steps of a quarter of
``max_history_messages`` (``trim_step``), counted from the start of the history, so the kept
part starts at the same turn for many calls and for the session's next runs, instead of
moving with every new message.

Both steps keep a tool exchange whole: an assistant message that calls tools and the tool
messages answering it are kept or dropped together, so a provider never sees a tool result
without its call.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, Protocol, runtime_checkable

from .bindings import ModelBinding, ModelBindings
from .content import TextPart
from .errors import ConfigurationError, ProviderError
from .messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from .model import Model, ModelEventKind, ModelRequest, ModelResponse

__all__ = [
    "DEFAULT_MAX_HISTORY_MESSAGES",
    "SUMMARY_PREFIX",
    "ContextCompactor",
    "LlmCompactor",
    "prepare_context",
    "trim_history",
    "trim_step",
]

logger = logging.getLogger("agent_runtime.compaction")

DEFAULT_MAX_HISTORY_MESSAGES = 200
SUMMARY_PREFIX = "[Summary of the earlier conversation]\n"
DEFAULT_INSTRUCTIONS = (
    "You compress conversations. Summarise the conversation you are given so that an assistant "
    "can continue it without seeing the original. Keep facts, decisions, names, numbers, file "
    "paths, open questions and the results of tool calls that may still matter. Drop greetings "
    "and repetition. Answer with the summary only."
)


@runtime_checkable
class ContextCompactor(Protocol):
    """Rewrites a run's history before a model call; returns the messages the model will see.

    It must keep each assistant message that calls tools together with the tool messages that
    answer it. It runs before every model call of a run, so it should return quickly when there
    is nothing to do.
    """

    async def compact(self, messages: list[Message], *, run_id: str) -> list[Message]:
        """The compacted history; may be ``messages`` itself when nothing changes."""
        ...


# units and turns --------------------------------------------------------------------------------


def _units(messages: Sequence[Message]) -> list[list[Message]]:
    """Split into units that are kept or dropped whole: a tool exchange, or one message."""
    units: list[list[Message]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if isinstance(message, AssistantMessage) and message.tool_calls:
            end = index + 1
            while end < len(messages) and isinstance(messages[end], ToolMessage):
                end += 1
            units.append(list(messages[index:end]))
            index = end
            continue
        if isinstance(message, ToolMessage) and units:
            # a result after something other than its call: keep it next to its neighbour
            units[-1].append(message)
        else:
            units.append([message])
        index += 1
    return units


def _is_summary(message: Message) -> bool:
    if isinstance(message, SystemMessage):
        return message.content.startswith(SUMMARY_PREFIX)
    return isinstance(message, UserMessage) and message.text.startswith(SUMMARY_PREFIX)


def _split_pinned(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """Leading system instructions (kept as they are) and the rest."""
    count = 0
    for message in messages:
        if not isinstance(message, SystemMessage) or _is_summary(message):
            break
        count += 1
    return list(messages[:count]), list(messages[count:])


def trim_step(max_messages: int) -> int:
    """How many messages the bound drops at least, once it drops any: a quarter of it."""
    return max(1, max_messages // 4)


def trim_history(messages: Sequence[Message], max_messages: int, *, step: int = 1) -> list[Message]:
    """Drop the oldest whole turns until at most ``max_messages`` remain.

    A turn starts at a user message. Leading system messages stay. When the latest turn alone is
    too long, its oldest steps go, but its user message and its latest step always stay, so the
    result can exceed the bound only when those alone do. A tool exchange is never split.

    ``step``: what is dropped is the excess rounded up to a multiple of it (then up to a turn's
    end), so the history's start moves in steps, not with each new message.
    """
    if max_messages < 1:
        raise ConfigurationError("max_history_messages must be at least 1")
    if len(messages) <= max_messages:
        return list(messages)
    pinned, rest = _split_pinned(messages)
    turns: list[list[list[Message]]] = []
    for unit in _units(rest):
        if not turns or isinstance(unit[0], UserMessage):
            turns.append([])
        turns[-1].append(unit)
    total = len(messages)
    excess = total - max_messages
    target = total - -(-excess // max(step, 1)) * max(step, 1)
    while len(turns) > 1 and total > target:
        total -= sum(len(unit) for unit in turns.pop(0))
    if total > max_messages and turns:
        last = turns[-1]
        head = last[:1] if isinstance(last[0][0], UserMessage) else []
        steps = last[len(head) :]
        while len(steps) > 1 and total > max_messages:
            total -= len(steps.pop(0))
        turns[-1] = head + steps
    return pinned + [m for turn in turns for unit in turn for m in unit]


async def prepare_context(
    messages: list[Message],
    *,
    compactor: ContextCompactor | None,
    max_messages: int | None,
    run_id: str,
) -> list[Message]:
    """The history for the next model call: compacted, then bounded (used by the run loop)."""
    result = messages
    if compactor is not None:
        result = list(await compactor.compact(list(messages), run_id=run_id))
    if max_messages is not None and len(result) > max_messages:
        result = trim_history(result, max_messages, step=trim_step(max_messages))
    return result


# the LLM compactor ------------------------------------------------------------------------------


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def _transcript(messages: Sequence[Message], limit: int) -> str:
    lines: list[str] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            lines.append(f"System: {_clip(message.content, limit)}")
        elif isinstance(message, UserMessage):
            # a summary keeps what was attached by name, never the bytes
            attached = "".join(
                f" [attached {p.describe()}]" for p in message.parts if not isinstance(p, TextPart)
            )
            lines.append(f"User: {_clip(message.text, limit)}{attached}")
        elif isinstance(message, AssistantMessage):
            if message.content:
                lines.append(f"Assistant: {_clip(message.content, limit)}")
            for call in message.tool_calls:
                arguments = json.dumps(call.arguments, ensure_ascii=False, default=str)
                lines.append(f"Assistant called tool {call.name} with {_clip(arguments, limit)}")
        else:
            outcome = "failed" if message.is_error else "returned"
            attached = "".join(f" [attached {p.describe()}]" for p in message.parts)
            lines.append(
                f"Tool {message.name} {outcome}: {_clip(message.content, limit)}{attached}"
            )
    return "\n".join(lines)


class LlmCompactor:
    """Summarises older messages through a model into one summary message.

    Once a history holds more than ``trigger_messages`` messages, everything but the last
    ``keep_last`` (moved back when needed so a tool exchange stays whole) and the leading system
    instructions is replaced by one message holding a summary, made with one model call. The
    summary is a ``user`` message by default (``summary_role="system"`` for a system one); a
    later compaction folds an earlier summary into the new one.

    ``model`` is a model, a ``ModelBinding`` or ``ModelBindings`` (its first llm binding). The
    summary's model call is not part of the run's events or usage. If it fails, the history is
    left as it was (and the agent's ``max_history_messages`` bound still applies).
    """

    def __init__(
        self,
        model: Model | ModelBinding | ModelBindings,
        *,
        keep_last: int = 10,
        trigger_messages: int = 40,
        instructions: str = DEFAULT_INSTRUCTIONS,
        summary_role: Literal["user", "system"] = "user",
        max_chars_per_message: int = 4000,
        model_params: Mapping[str, Any] | None = None,
    ) -> None:
        if keep_last < 1:
            raise ConfigurationError("keep_last must be at least 1")
        if trigger_messages <= keep_last:
            raise ConfigurationError("trigger_messages must be larger than keep_last")
        if summary_role not in ("user", "system"):
            raise ConfigurationError("summary_role must be 'user' or 'system'")
        if isinstance(model, ModelBindings):
            self._binding: ModelBinding | None = model.llm[0]
            self._model: Model | None = None
        elif isinstance(model, ModelBinding):
            self._binding, self._model = model, None
        elif callable(getattr(model, "stream", None)):
            self._binding, self._model = None, model
        else:
            raise ConfigurationError(f"{model!r} is not a model, ModelBinding or ModelBindings")
        self.keep_last = keep_last
        self.trigger_messages = trigger_messages
        self.instructions = instructions
        self.summary_role = summary_role
        self.max_chars_per_message = max_chars_per_message
        self.model_params = dict(model_params or {})

    def __repr__(self) -> str:
        return f"<LlmCompactor keep_last={self.keep_last} trigger_messages={self.trigger_messages}>"

    async def compact(self, messages: list[Message], *, run_id: str) -> list[Message]:
        if len(messages) <= self.trigger_messages:
            return messages
        pinned, rest = _split_pinned(messages)
        start = max(len(rest) - self.keep_last, 0)
        while start > 0 and isinstance(rest[start], ToolMessage):
            start -= 1  # take the call that these results answer into the kept part
        if start == 0:
            return messages
        older, kept = rest[:start], rest[start:]
        try:
            summary = (await self._summarise(older, run_id)).strip()
        except Exception as exc:
            logger.warning(
                "context compaction failed; the history is left as it was",
                extra={"run_id": run_id, "error": type(exc).__name__},
            )
            return messages
        if not summary:
            return messages
        content = SUMMARY_PREFIX + summary
        note: Message = (
            UserMessage(content) if self.summary_role == "user" else SystemMessage(content)
        )
        return [*pinned, note, *kept]

    @asynccontextmanager
    async def _lease(self) -> AsyncIterator[Model]:
        if self._binding is not None:
            async with self._binding.lease_provider() as provider:
                yield provider
        else:
            assert self._model is not None
            yield self._model

    async def _summarise(self, messages: Sequence[Message], run_id: str) -> str:
        request = ModelRequest(
            messages=[UserMessage(_transcript(messages, self.max_chars_per_message))],
            system=self.instructions,
            run_id=run_id,
            model_call_id=f"compact_{secrets.token_hex(8)}",
            params=dict(self.model_params),
        )
        response: ModelResponse | None = None
        async with self._lease() as model:
            stream = model.stream(request)
            try:
                async for event in stream:
                    if event.kind is ModelEventKind.COMPLETED:
                        response = event.response
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        if response is None:
            raise ProviderError("the summary model ended its stream without a completed event")
        return response.message.content or ""
