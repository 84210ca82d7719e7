"""Anthropic Messages, streamed, through ``anthropic.AsyncAnthropic``.

The raw event stream of ``messages.create(stream=True)`` is folded into ModelEvents:
``text_delta`` becomes a text event; a ``tool_use`` block collects its ``input_json_delta``
fragments and becomes a tool call at its ``content_block_stop``; ``thinking`` blocks stream as
reasoning events and, with ``redacted_thinking`` blocks, become the answer's reasoning state
(``anthropic_thinking``), sent back ahead of the turn's text and ``tool_use`` blocks.

Usage: Anthropic's ``input_tokens`` count only the input read neither from nor into the prompt
cache, so ``Usage.input_tokens`` is ``input_tokens + cache_read_input_tokens +
cache_creation_input_tokens`` of ``message_start`` (all input, as on the other wires), with
``cached_input_tokens`` the cache reads and ``cache_write_tokens`` the cache writes. Output
tokens come from the last ``message_delta``, thinking included (``reasoning_tokens`` where it
reports ``output_tokens_details.thinking_tokens``).

Prompt caching (``anthropic_cache``) is on unless the model param ``prompt_caching`` is false.
With thinking on (the ``thinking`` param) a tool loop whose last assistant turn has no thinking
of Anthropic's (a failover from another provider) goes on without thinking, as the API would
refuse it; structured output then lets the model choose its tool (``auto``), as the API
refuses a forced one with manual thinking.

Structured output (``request.output_schema``) is a tool of the schema's name that the model is
made to call (``tool_choice``); its input, as JSON text, becomes the answer's text. A schema that
is not an object is wrapped as the tool's ``value`` property, since a tool's input is an object.

Images and documents go as the blocks ``anthropic_content`` describes. Tool results travel
back as ``tool_result`` blocks of a user turn. The Messages API wants user and assistant turns
to alternate, so consecutive messages of one role are merged into one turn.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from anthropic import NOT_GIVEN, AnthropicError, AsyncAnthropic, AsyncStream, omit
from anthropic.types import (
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStreamEvent,
)

from ..errors import ProviderError
from ..input_kinds import ALL_INPUT_KINDS, as_input_kinds, fit_messages
from ..messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from ..model import (
    ModelEvent,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    RetryOptions,
    ToolSpec,
    Usage,
)
from .anthropic_cache import mark_breakpoints
from .anthropic_content import tool_result_content, user_blocks
from .anthropic_thinking import WIRE, ThinkingBlocks, thinking_mode, unsigned_tool_turn
from .caching import caching_enabled
from .errors import configuration_error, redact, stream_ended_early, translate_errors
from .media import MediaReader
from .openai import parse_arguments

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicModel"]

logger = logging.getLogger("agent_runtime.providers")

#: ``max_tokens`` is required by the Messages API; this is sent unless params give one.
DEFAULT_MAX_TOKENS = 4096

_SDK_OPTIONS = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})

# imported lazily by a first call (asyncio backend of anyio, HTTP/1.1 machinery, SDK helpers)
_FIRST_CALL_MODULES = (
    "anyio._backends._asyncio",
    "h11",
    "httpcore2._async.http11",
    "httpcore2._backends.anyio",
)


@dataclass(slots=True)
class _PartialToolUse:
    id: str
    name: str
    fragments: list[str] = field(default_factory=list)


class AnthropicModel:
    """A Claude model behind the Anthropic Messages API (or a compatible endpoint).

    Options mirror ``OpenAIModel``: ``timeout``/``max_retries`` configure the SDK client,
    ``params`` go into every request (``max_tokens`` defaults to ``max_tokens``), ``retry`` is
    the runtime's own retry on top of the SDK's (none by default). ``input_kinds`` is what
    the model takes: text, images and documents unless narrowed.
    """

    retry: RetryOptions
    input_kinds: frozenset[str]

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        params: Mapping[str, Any] | None = None,
        retry: RetryOptions | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        provider_name: str = "anthropic",
        default_headers: Mapping[str, str] | None = None,
        client: AsyncAnthropic | None = None,
        input_kinds: Iterable[str] | None = None,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty string")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self._model = model
        self.provider_name = provider_name
        self.input_kinds = ALL_INPUT_KINDS if input_kinds is None else as_input_kinds(input_kinds)
        self.params = dict(params or {})
        self.max_tokens = max_tokens
        self.retry = retry if retry is not None else RetryOptions(max_retries=0)
        self._owns_client = client is None
        if client is None:
            options: dict[str, Any] = {}
            if timeout is not None:
                options["timeout"] = timeout
            if max_retries is not None:
                options["max_retries"] = max_retries
            try:
                client = AsyncAnthropic(
                    api_key=api_key, base_url=base_url, default_headers=default_headers, **options
                )
            except (AnthropicError, ValueError, TypeError) as exc:
                raise configuration_error(
                    exc,
                    what=f"could not build the {provider_name} client for model {model!r}",
                    secrets=[api_key] if api_key else [],
                ) from exc
        self._client = client
        self._secrets: tuple[str, ...] = tuple(
            key
            for key in (api_key, client.api_key, client.auth_token)
            if isinstance(key, str) and key
        )
        self._closed = False

    def __repr__(self) -> str:
        base_url = redact(str(self._client.base_url), self._secrets)
        return (
            f"AnthropicModel(model={self._model!r}, base_url={base_url!r}, closed={self._closed})"
        )

    @property
    def model_name(self) -> str:
        """The model the requests name."""
        return self._model

    @property
    def client(self) -> AsyncAnthropic:
        """The SDK client."""
        return self._client

    @property
    def closed(self) -> bool:
        """True once ``aclose`` ran."""
        return self._closed

    def prepare(self) -> None:
        """Do the one-time work of a first call now: the SDK and its HTTP stack import modules
        lazily on first use. Needs no loop; the bindings call it in a worker thread."""
        self._client.messages  # noqa: B018 - the property imports the resource modules
        for name in _FIRST_CALL_MODULES:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

    async def aclose(self) -> None:
        """Close the SDK client if this model built it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.close()

    # requests ---------------------------------------------------------------------------------

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        return {**self.params, **request.params}

    async def _open(self, request: ModelRequest) -> AsyncStream[RawMessageStreamEvent]:
        params = self._params(request)
        options = {key: params.pop(key) for key in list(params) if key in _SDK_OPTIONS}
        extra_body: dict[str, Any] = dict(options.get("extra_body") or {})
        caching = caching_enabled(params)
        system_parts, messages = await self._messages(request)
        thinking = self._thinking(params, messages)
        max_tokens = int(params.pop("max_tokens", 0)) or _max_tokens(self.max_tokens, params)
        extra_body.update(params)
        tools = _tools(request.tools)
        tool_choice: Any = omit
        output = request.output_schema
        if output is not None:
            # with other tools the model may still call them first; the answer is this one
            if thinking == "enabled":
                tool_choice = {"type": "auto"}  # forcing a tool is refused with manual thinking
            else:
                tool_choice = {"type": "any"} if tools else {"type": "tool", "name": output.name}
            tools.append(_output_tool(output))
        system: Any = "\n\n".join(system_parts)
        if caching:
            system = [{"type": "text", "text": part} for part in system_parts]
            mark_breakpoints(tools, system, messages)
        return await self._client.messages.create(
            model=self._model,
            max_tokens=max_tokens,
            messages=cast(Any, messages),
            system=system if system else omit,
            tools=cast(Any, tools) if tools else omit,
            tool_choice=tool_choice,
            stream=True,
            extra_body=extra_body or None,
            extra_headers=options.get("extra_headers"),
            extra_query=options.get("extra_query"),
            timeout=options.get("timeout", NOT_GIVEN),
        )

    async def _messages(self, request: ModelRequest) -> tuple[list[str], list[dict[str, Any]]]:
        """The system prompt's parts and the turns on the wire; UnsupportedContentError for a
        part they cannot carry."""
        messages = fit_messages(
            request.messages, self.input_kinds, model=self._model, provider=self.provider_name
        )
        reader = MediaReader(request, self._model, self.provider_name)
        return await _messages(request.system, messages, reader)

    def _thinking(self, params: dict[str, Any], turns: list[dict[str, Any]]) -> str | None:
        """The request's thinking mode; thinking is dropped from ``params`` where the API
        would refuse it (a tool loop whose last assistant turn has no thinking block)."""
        mode = thinking_mode(params)
        if mode is not None and unsigned_tool_turn(turns):
            logger.info(
                "continuing a tool loop without thinking: its last assistant turn has no "
                "thinking block (it came from another provider)",
                extra={"model": self._model},
            )
            del params["thinking"]
            return None
        return mode

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one Messages call as ModelEvents."""
        if self._closed:
            raise ProviderError(
                f"the provider for model {self._model!r} is closed", provider=self.provider_name
            )
        text: list[str] = []
        calls: list[ToolCall] = []
        open_tools: dict[int, _PartialToolUse] = {}
        thinking = ThinkingBlocks()
        counts = _Counts()
        stop_reason: str | None = None
        with translate_errors(
            provider=self.provider_name, model=self._model, secrets=self._secrets
        ):
            events = await self._open(request)
            try:
                async for event in events:
                    if isinstance(event, RawContentBlockDeltaEvent):
                        item = _on_delta(event, text, open_tools, thinking)
                        if item is not None:
                            yield item
                    elif isinstance(event, RawContentBlockStartEvent):
                        item = _on_start(event, text, open_tools, thinking)
                        if item is not None:
                            yield item
                    elif isinstance(event, RawContentBlockStopEvent):
                        thinking.stop(event.index)
                        finished = open_tools.pop(event.index, None)
                        if finished is not None:
                            call = self._complete(finished)
                            answer = _output_text(request.output_schema, call)
                            if answer is not None:
                                text.append(answer)
                                yield ModelEvent.text(answer)
                            else:
                                calls.append(call)
                                yield ModelEvent.tool_call(call)
                    elif isinstance(event, RawMessageStartEvent):
                        counts.start(event.message.usage)
                    elif isinstance(event, RawMessageDeltaEvent):
                        counts.delta(event.usage)
                        if event.delta.stop_reason is not None:
                            stop_reason = event.delta.stop_reason
            finally:
                await events.close()
        if stop_reason is None:
            raise stream_ended_early(
                events.response,
                provider=self.provider_name,
                model=self._model,
                marker="stop_reason",
            )
        for index in sorted(open_tools):  # a block the stream never closed
            call = self._complete(open_tools[index])
            calls.append(call)
            yield ModelEvent.tool_call(call)
        reasoning, state = thinking.finish()
        message = AssistantMessage(
            "".join(text) or None, calls, reasoning=reasoning, reasoning_state=state
        )
        yield ModelEvent.completed(ModelResponse(message, counts.usage(), stop_reason))

    def _complete(self, partial: _PartialToolUse) -> ToolCall:
        arguments = parse_arguments(
            "".join(partial.fragments), partial.name, self._model, self.provider_name
        )
        return ToolCall(partial.id, partial.name, arguments)


def _on_start(
    event: RawContentBlockStartEvent,
    text: list[str],
    open_tools: dict[int, _PartialToolUse],
    thinking: ThinkingBlocks,
) -> ModelEvent | None:
    """A content block starts: a tool call opens, or text or reasoning comes with it."""
    block = event.content_block
    if block.type == "tool_use":
        open_tools[event.index] = _PartialToolUse(block.id, block.name)
    elif block.type == "text":
        if block.text:
            text.append(block.text)
            return ModelEvent.text(block.text)
    else:
        thought = thinking.start(event.index, block)
        if thought:
            return ModelEvent.reasoning(thought)
    return None


def _on_delta(
    event: RawContentBlockDeltaEvent,
    text: list[str],
    open_tools: dict[int, _PartialToolUse],
    thinking: ThinkingBlocks,
) -> ModelEvent | None:
    """A piece of a content block: text, a tool call's arguments, thinking or its signature."""
    delta = event.delta
    if delta.type == "text_delta":
        if delta.text:
            text.append(delta.text)
            return ModelEvent.text(delta.text)
    elif delta.type == "input_json_delta":
        partial = open_tools.get(event.index)
        if partial is not None:
            partial.fragments.append(delta.partial_json)
    else:
        thought = thinking.delta(event.index, delta)
        if thought:
            return ModelEvent.reasoning(thought)
    return None


@dataclass(slots=True)
class _Counts:
    """The call's token counts: ``message_start``'s, updated by each ``message_delta``."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read: int | None = None
    cache_write: int | None = None
    thinking: int | None = None

    def start(self, usage: Any) -> None:
        self.input_tokens = usage.input_tokens
        self.output_tokens = usage.output_tokens or None
        self.cache_read = usage.cache_read_input_tokens
        self.cache_write = usage.cache_creation_input_tokens

    def delta(self, usage: Any) -> None:
        self.output_tokens = usage.output_tokens
        # a delta's counts, where it gives them, are the call's totals
        if usage.input_tokens is not None:
            self.input_tokens = usage.input_tokens
        if usage.cache_read_input_tokens is not None:
            self.cache_read = usage.cache_read_input_tokens
        if usage.cache_creation_input_tokens is not None:
            self.cache_write = usage.cache_creation_input_tokens
        details = getattr(usage, "output_tokens_details", None)
        if details is not None:
            self.thinking = details.thinking_tokens

    def usage(self) -> Usage | None:
        if self.input_tokens is None and self.output_tokens is None:
            return None
        # Anthropic's input_tokens leave out what was read from or written to the cache
        total = (self.input_tokens or 0) + (self.cache_read or 0) + (self.cache_write or 0)
        return Usage(
            total,
            self.output_tokens or 0,
            cached_input_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            reasoning_tokens=self.thinking,
        )


def _max_tokens(default: int, params: Mapping[str, Any]) -> int:
    """``max_tokens`` when the params give none: the model's default, or more than a
    thinking budget that would not fit below it (the API wants ``max_tokens`` above it)."""
    thinking = params.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, Mapping) else None
    if isinstance(budget, int) and budget >= default:
        return budget + default
    return default


async def _messages(
    system: str | None, messages: Sequence[Message], reader: MediaReader
) -> tuple[list[str], list[dict[str, Any]]]:
    """The system prompt's parts and the alternating turns of the Messages API."""
    system_parts = [system] if system else []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        if isinstance(message, SystemMessage):
            if message.content:
                system_parts.append(message.content)
        elif isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                add("user", [{"type": "text", "text": content}] if content else [])
            else:
                add("user", await user_blocks(content, reader))
        elif isinstance(message, AssistantMessage):
            # its thinking first, as the API requires (another provider's state: not sent)
            blocks: list[dict[str, Any]] = message.reasoning_blocks(WIRE)
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            blocks.extend(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
                for call in message.tool_calls
            )
            add("assistant", blocks)
        elif isinstance(message, ToolMessage):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": await tool_result_content(message, reader),
            }
            if message.is_error:
                result["is_error"] = True
            add("user", [result])
    return system_parts, turns


def _wrapped(output: OutputSchema) -> bool:
    return output.schema.get("type") != "object"


def _output_tool(output: OutputSchema) -> dict[str, Any]:
    schema = output.schema
    if _wrapped(output):
        schema = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
    return {
        "name": output.name,
        "description": "Give your final answer: call this tool with the answer as its input.",
        "input_schema": schema,
    }


def _output_text(output: OutputSchema | None, call: ToolCall) -> str | None:
    """The answer's JSON text when ``call`` is the structured-output tool, else None."""
    if output is None or call.name != output.name:
        return None
    value: Any = call.arguments
    if _wrapped(output):
        value = call.arguments.get("value")
    return json.dumps(value, ensure_ascii=False)


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}
        for spec in tools
    ]
