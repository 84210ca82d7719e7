"""The OpenAI Responses API (``POST /v1/responses``), streamed: the wire of OpenAI's reasoning.

``OpenAIResponsesModel`` is a binding's ``openai-responses`` protocol
(``openai-responses:MODEL``). It shares ``OpenAIModel``'s client, options, retries and error
mapping, and like it posts through the client's own ``post`` and reads each event as decoded
JSON. Every request is ``store: false`` (OpenAI keeps nothing between calls: the whole
conversation goes each time) and asks for ``include: ["reasoning.encrypted_content"]``, so a
reasoning model's reasoning items come back whole and go back in the next call of the tool
loop, where the model needs them.

The conversation as input items::

    system prompt           instructions
    system message          {"role": "system", "content"}
    user message            {"role": "user", "content"}: its text, or input_text,
                            input_image and input_file parts
    assistant message       its reasoning items (this wire's state only: another provider's
                            is not sent), {"role": "assistant", "content"}, then one
                            function_call item per tool call
    tool result             a function_call_output item (with input_image parts for images)

The stream as model events::

    response.reasoning_summary_text.delta   reasoning (a new summary part after a blank line)
    response.reasoning_text.delta           reasoning (models that show their raw reasoning)
    response.output_text.delta, .refusal.delta      text
    response.output_item.done               a function_call: a tool call; a reasoning item:
                                            a block of the answer's reasoning_state
    response.completed, response.incomplete usage; the end of the answer
    response.failed, error                  ProviderStatusError (retryable: server errors)

Params go into the body as given (``max_output_tokens``, ``temperature``, ...); ``max_tokens``
is read as ``max_output_tokens`` and ``reasoning_effort`` as ``reasoning.effort``, as on the
other wires. ``reasoning`` is sent only when asked for (models without reasoning refuse it),
with ``summary: "auto"`` unless it says otherwise: the summary is what streams as reasoning.
``prompt_cache_key`` is the request's ``cache_key`` unless ``prompt_caching`` is false.

Usage: ``input_tokens`` (all input, cached included) and ``output_tokens`` (reasoning
included), with ``input_tokens_details.cached_tokens`` (``cached_input_tokens``),
``cache_write_tokens`` and ``output_tokens_details.reasoning_tokens``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from openai import AsyncStream

from ..content import DocumentPart, ImagePart, MediaPart, TextPart, data_url
from ..errors import ProviderError
from ..messages import (
    AssistantMessage,
    ReasoningState,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ..model import ModelEvent, ModelRequest, ModelResponse, OutputSchema, ToolSpec, Usage
from .caching import caching_enabled
from .errors import stream_ended_early, stream_error, translate_errors
from .openai import _SDK_OPTIONS, _SECURITY, OpenAIModel, parse_arguments

__all__ = ["WIRE", "OpenAIResponsesModel"]

#: ``ReasoningState.provider`` of this wire's reasoning items, and the binding protocol's name.
WIRE = "openai-responses"

# the item fields a reasoning item goes back with (its status is the API's to set)
_REASONING_FIELDS = ("type", "id", "summary", "content", "encrypted_content")
_REASONING_DELTAS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)
_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
# bytes past this size are base64-encoded in a worker thread, off the event loop
_INLINE_ENCODE_LIMIT = 256 * 1024


class OpenAIResponsesModel(OpenAIModel):
    """A model behind the OpenAI Responses API: ``OpenAIModel``'s options, another wire."""

    def __repr__(self) -> str:
        return super().__repr__().replace("OpenAIModel(", "OpenAIResponsesModel(", 1)

    def prepare(self) -> None:
        """Do the one-time work of a first call now (see ``OpenAIModel.prepare``)."""
        super().prepare()
        self._client.responses  # noqa: B018 - the property imports the resource modules

    async def _open(self, request: ModelRequest) -> AsyncStream[object]:
        params = {**self.params, **request.params}
        options = {key: params.pop(key) for key in list(params) if key in _SDK_OPTIONS}
        caching = caching_enabled(params)
        if "max_tokens" in params:
            params.setdefault("max_output_tokens", params.pop("max_tokens"))
        reasoning = _reasoning(params.pop("reasoning", None), params.pop("reasoning_effort", None))
        body: dict[str, Any] = {
            "model": self._model,
            "input": await _input(request),
            "stream": True,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = _tools(request.tools)
        if request.output_schema is not None:
            body["text"] = {"format": _text_format(request.output_schema)}
        if reasoning is not None:
            body["reasoning"] = reasoning
        if caching and request.cache_key:
            body["prompt_cache_key"] = request.cache_key
        body.update(options.get("extra_body") or {})
        body.update(params)
        sent: dict[str, Any] = {"security": _SECURITY}
        if options.get("extra_headers") is not None:
            sent["headers"] = options["extra_headers"]
        if options.get("extra_query") is not None:
            sent["params"] = options["extra_query"]
        if "timeout" in options:
            sent["timeout"] = options["timeout"]
        return await self._client.post(
            "/responses",
            body=body,
            cast_to=object,
            options=cast(Any, sent),
            stream=True,
            stream_cls=AsyncStream[object],
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one Responses call as ModelEvents."""
        if self._closed:
            raise ProviderError(
                f"the provider for model {self._model!r} is closed", provider=self.provider_name
            )
        answer = _Answer(self)
        with translate_errors(
            provider=self.provider_name, model=self._model, secrets=self._secrets
        ):
            events = await self._open(request)
            try:
                async for event in events:
                    if not isinstance(event, dict):
                        raise self._malformed("an event that is not a JSON object")
                    item = answer.feed(event)
                    if item is not None:
                        yield item
            finally:
                await events.close()
        if answer.stop_reason is None:
            raise stream_ended_early(
                events.response,
                provider=self.provider_name,
                model=self._model,
                marker="response.completed",
            )
        yield ModelEvent.completed(answer.response())


class _Answer:
    """One streamed answer, folded from the Responses events as they come."""

    __slots__ = ("_model", "_part", "blocks", "calls", "reasoning", "stop_reason", "text", "usage")

    def __init__(self, model: OpenAIResponsesModel) -> None:
        self._model = model
        self._part: tuple[str, int] | None = None  # the reasoning part being streamed
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []
        self.blocks: list[dict[str, Any]] = []
        self.usage: Usage | None = None
        self.stop_reason: str | None = None

    def feed(self, event: dict[str, Any]) -> ModelEvent | None:
        """Take one event; the model event it makes, if any."""
        kind = event.get("type")
        if kind in _TEXT_DELTAS:
            delta = self._string(event.get("delta"), "a text delta")
            if delta:
                self.text.append(delta)
                return ModelEvent.text(delta)
        elif kind in _REASONING_DELTAS:
            return self._thought(event)
        elif kind == "response.output_item.done":
            return self._item(event.get("item"))
        elif kind in ("response.completed", "response.incomplete"):
            self._end(event.get("response"))
        elif kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            self._fail(error if isinstance(error, dict) else {})
        elif kind == "error":
            self._fail(event)
        return None

    def response(self) -> ModelResponse:
        """The whole answer, once the stream ended."""
        state = ReasoningState(WIRE, tuple(self.blocks)) if self.blocks else None
        message = AssistantMessage(
            "".join(self.text) or None,
            self.calls,
            reasoning="".join(self.reasoning) or None,
            reasoning_state=state,
        )
        return ModelResponse(message, self.usage, self.stop_reason)

    def _thought(self, event: dict[str, Any]) -> ModelEvent | None:
        delta = self._string(event.get("delta"), "a reasoning delta")
        if not delta:
            return None
        part = (str(event.get("item_id")), int(event.get("summary_index") or 0))
        if part != self._part:
            if self.reasoning:
                delta = "\n\n" + delta  # a new summary part reads as a new paragraph
            self._part = part
        self.reasoning.append(delta)
        return ModelEvent.reasoning(delta)

    def _item(self, item: Any) -> ModelEvent | None:
        if not isinstance(item, dict):
            raise self._model._malformed("an output item that is not a JSON object")
        kind = item.get("type")
        if kind == "function_call":
            name = self._string(item.get("name"), "a function call's name")
            if not name:
                raise self._model._malformed("a function call without a name")
            call_id = self._string(item.get("call_id"), "a function call's id")
            raw = self._string(item.get("arguments"), "a function call's arguments")
            model = self._model
            arguments = parse_arguments(raw, name, model.model_name, model.provider_name)
            call = ToolCall(call_id or str(item.get("id") or ""), name, arguments)
            self.calls.append(call)
            return ModelEvent.tool_call(call)
        if kind == "reasoning":
            self.blocks.append({k: item[k] for k in _REASONING_FIELDS if item.get(k) is not None})
            return self._unstreamed_summary(item)
        return None

    def _unstreamed_summary(self, item: dict[str, Any]) -> ModelEvent | None:
        """A reasoning item's summary that came whole, without deltas: streamed now."""
        if self._part is not None and self._part[0] == str(item.get("id")):
            return None
        texts = [
            part.get("text")
            for part in item.get("summary") or ()
            if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("text")
        ]
        if not texts:
            return None
        text = "\n\n".join(cast(list[str], texts))
        if self.reasoning:
            text = "\n\n" + text
        self.reasoning.append(text)
        return ModelEvent.reasoning(text)

    def _end(self, response: Any) -> None:
        if not isinstance(response, dict):
            raise self._model._malformed("a response that is not a JSON object")
        self.usage = _usage(response.get("usage"))
        if response.get("status") == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self.stop_reason = str(reason or "incomplete")
        else:
            self.stop_reason = "tool_calls" if self.calls else "stop"

    def _fail(self, error: Mapping[str, Any]) -> None:
        model = self._model
        code = error.get("code") or error.get("type")
        message = error.get("message")
        raise stream_error(
            str(code) if code is not None else None,
            str(message) if message is not None else None,
            provider=model.provider_name,
            model=model.model_name,
            secrets=model._secrets,
        )

    def _string(self, value: Any, what: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._model._malformed(f"{what} that is not a string")
        return value


# requests -----------------------------------------------------------------------------------------


def _reasoning(reasoning: Any, effort: Any) -> Any:
    """The body's ``reasoning``: as given, with ``summary: "auto"`` unless it says otherwise."""
    if reasoning is None and effort is None:
        return None
    if reasoning is not None and not isinstance(reasoning, Mapping):
        return reasoning  # not ours to fix: the API says what is wrong with it
    merged: dict[str, Any] = {"summary": "auto"}
    if effort is not None:
        merged["effort"] = effort
    merged.update(reasoning or {})
    return merged


async def _input(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Responses input items (see the module docstring)."""
    items: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, SystemMessage):
            items.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            content: Any = message.content
            if not isinstance(content, str):
                content = [await _part(part, request) for part in content]
            items.append({"role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            if message.content or message.tool_calls:
                # a reasoning item goes back only with the output it led to
                items.extend(message.reasoning_blocks(WIRE))
            if message.content:
                items.append({"role": "assistant", "content": message.content})
            items.extend(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                }
                for call in message.tool_calls
            )
        elif isinstance(message, ToolMessage):
            output: Any = message.content
            if message.parts:
                output = [
                    {"type": "input_text", "text": message.content},
                    *[await _part(part, request) for part in message.parts],
                ]
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id, "output": output}
            )
    return items


async def _part(part: TextPart | MediaPart, request: ModelRequest) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        url = part.url if part.url is not None else await _data_url(part, request)
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    assert isinstance(part, DocumentPart)
    if part.url is not None and part.url.startswith("https:"):
        return {"type": "input_file", "file_url": part.url}
    file_data = part.url if part.url is not None else await _data_url(part, request)
    return {"type": "input_file", "filename": part.filename or "document", "file_data": file_data}


async def _data_url(part: MediaPart, request: ModelRequest) -> str:
    data = await request.media_bytes(part)
    media_type = part.media_type or "application/octet-stream"
    if len(data) > _INLINE_ENCODE_LIMIT:
        return await asyncio.to_thread(data_url, media_type, data)
    return data_url(media_type, data)


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    # strict is false: the API's default (true) refuses schemas that are not strict-ready
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
            "strict": False,
        }
        for spec in tools
    ]


def _text_format(output: OutputSchema) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "name": output.name,
        "schema": output.schema,
        "strict": output.strict,
    }


def _usage(counted: Any) -> Usage | None:
    if not isinstance(counted, dict):
        return None

    def count(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def detail(group: str, name: str) -> int | None:
        details = counted.get(group)
        return count(details.get(name)) if isinstance(details, dict) else None

    return Usage(
        count(counted.get("input_tokens")) or 0,
        count(counted.get("output_tokens")) or 0,
        cached_input_tokens=detail("input_tokens_details", "cached_tokens"),
        cache_write_tokens=detail("input_tokens_details", "cache_write_tokens"),
        reasoning_tokens=detail("output_tokens_details", "reasoning_tokens"),
    )
