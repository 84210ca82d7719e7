"""OpenAI Chat Completions, streamed, for api.openai.com and any compatible endpoint.

``OpenAIModel`` speaks the Chat Completions wire protocol through ``openai.AsyncOpenAI``, so it
serves every host that implements it (DeepSeek, Groq, Together, OpenRouter, Ollama, vLLM, ...)
given a ``base_url``. One request per model call, ``stream=True`` with usage requested in the
final chunk. Tool-call arguments arrive as string fragments keyed by the call's index; each call
is yielded once the stream says the calls are finished.

The request goes through the client's own ``post``, so its retries, auth, timeouts and error
types all apply, but the body is sent as built here and each chunk is read as the decoded JSON:
the typed ``create`` walks the body's type annotations and builds a pydantic model per chunk,
which was most of a run's time before its first token.

Usage: ``prompt_tokens`` (all input, the cached part included), ``completion_tokens``, and
from their details ``cached_tokens`` (``cached_input_tokens``), ``cache_write_tokens`` and
``reasoning_tokens`` (a part of the output), where the host reports them. OpenAI's models
show no reasoning text on this wire; a host that streams it as ``reasoning_content`` (DeepSeek,
vLLM) gives reasoning events, kept as the answer's visible ``reasoning`` and never sent back.
Prompt caching: OpenAI caches prefixes by itself; a binding whose provider is ``openai``
sends the request's ``cache_key`` as ``prompt_cache_key`` (unless ``prompt_caching`` is
false), so a session's calls go to the same cache. Other hosts do not get it (some refuse
parameters they do not know).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from openai import AsyncOpenAI, AsyncStream, OpenAIError

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
from .caching import caching_enabled
from .errors import (
    MALFORMED_RESPONSE,
    configuration_error,
    redact,
    stream_ended_early,
    translate_errors,
)
from .media import MediaReader
from .openai_content import content_array, tool_media_message

__all__ = ["OpenAIModel"]

# request options the SDK takes as arguments of create(); every other param goes in the body
_SDK_OPTIONS = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})
# what the typed create() asks of the client for this endpoint: the API key as a bearer token
_SECURITY = {"bearer_auth": True}

# imported lazily by a first call (asyncio backend of anyio, HTTP/1.1 machinery, SDK helpers)
_FIRST_CALL_MODULES = (
    "anyio._backends._asyncio",
    "h11",
    "httpcore2._async.http11",
    "httpcore2._backends.anyio",
    "openai.lib.streaming.chat",
)


_EMPTY: dict[str, Any] = {}


@dataclass(slots=True)
class _PartialCall:
    id: str
    name: str = ""
    fragments: list[str] = field(default_factory=list)


class OpenAIModel:
    """A model behind an OpenAI-compatible Chat Completions endpoint.

    ``timeout`` and ``max_retries`` configure the SDK client (None keeps the SDK's defaults:
    600 s read timeout, 2 retries). ``params`` are sent with every request (``temperature``,
    ``max_tokens``, ...); a request's own params win. ``retry`` is how often the runtime repeats
    a failed call on top of the SDK's retries: none by default, because the SDK already retried
    and the next binding is the better next step. Pass ``client`` to use a client you own; it is
    then yours to close. ``input_kinds`` is what the model takes (text, images and documents
    unless narrowed: ``{"text"}`` for a text-only model behind this wire).
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
        provider_name: str = "openai",
        default_headers: Mapping[str, str] | None = None,
        client: AsyncOpenAI | None = None,
        input_kinds: Iterable[str] | None = None,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty string")
        self._model = model
        self.provider_name = provider_name
        self.input_kinds = ALL_INPUT_KINDS if input_kinds is None else as_input_kinds(input_kinds)
        self.params = dict(params or {})
        self.retry = retry if retry is not None else RetryOptions(max_retries=0)
        self._owns_client = client is None
        if client is None:
            options: dict[str, Any] = {}
            if timeout is not None:
                options["timeout"] = timeout
            if max_retries is not None:
                options["max_retries"] = max_retries
            try:
                client = AsyncOpenAI(
                    api_key=api_key, base_url=base_url, default_headers=default_headers, **options
                )
            except (OpenAIError, ValueError, TypeError) as exc:
                raise configuration_error(
                    exc,
                    what=f"could not build the {provider_name} client for model {model!r}",
                    secrets=[api_key] if api_key else [],
                ) from exc
        self._client = client
        self._secrets: tuple[str, ...] = tuple(
            key for key in (api_key, client.api_key) if isinstance(key, str) and key
        )
        self._closed = False

    def __repr__(self) -> str:
        base_url = redact(str(self._client.base_url), self._secrets)
        return f"OpenAIModel(model={self._model!r}, base_url={base_url!r}, closed={self._closed})"

    @property
    def model_name(self) -> str:
        """The model the requests name."""
        return self._model

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client."""
        return self._client

    @property
    def closed(self) -> bool:
        """True once ``aclose`` ran."""
        return self._closed

    def prepare(self) -> None:
        """Do the one-time work of a first call now: the SDK and its HTTP stack import modules
        lazily on first use. Needs no loop; the bindings call it in a worker thread."""
        self._client.chat.completions  # noqa: B018 - the property imports the resource modules
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

    async def _open(self, request: ModelRequest) -> AsyncStream[object]:
        params = {**self.params, **request.params}
        options = {key: params.pop(key) for key in list(params) if key in _SDK_OPTIONS}
        stream_options = params.pop("stream_options", {"include_usage": True})
        reader = MediaReader(request, self._model, self.provider_name)
        caching = caching_enabled(params)
        body: dict[str, Any] = {
            "model": self._model,
            "messages": await self._messages(request, reader),
            "stream": True,
        }
        if stream_options is not None:
            body["stream_options"] = stream_options
        if caching and request.cache_key and self.provider_name == "openai":
            body["prompt_cache_key"] = request.cache_key
        if request.tools:
            body["tools"] = _tools(request.tools)
        if request.output_schema is not None:
            body["response_format"] = _response_format(request.output_schema)
        # extra_body, then the params, win over what is built here (as they did through create())
        body.update(options.get("extra_body") or {})
        body.update(params)
        sent: dict[str, Any] = {"security": _SECURITY}
        if options.get("extra_headers") is not None:
            sent["headers"] = options["extra_headers"]
        if options.get("extra_query") is not None:
            sent["params"] = options["extra_query"]
        if "timeout" in options:
            sent["timeout"] = options["timeout"]
        encoded: bytes | None = None
        if reader.heavy:
            # the SDK would encode it on the loop: a 20 MB image is a 27 MB JSON string
            encoded = await asyncio.to_thread(_json_bytes, body)
        # cast_to=object: the SDK hands each chunk over as its decoded JSON, unconverted
        return await self._client.post(
            "/chat/completions",
            body=None if encoded is not None else body,
            content=encoded,
            cast_to=object,
            options=cast(Any, sent),
            stream=True,
            stream_cls=AsyncStream[object],
        )

    async def _messages(self, request: ModelRequest, reader: MediaReader) -> list[dict[str, Any]]:
        """The conversation on the wire; UnsupportedContentError for a part it cannot carry."""
        messages = fit_messages(
            request.messages, self.input_kinds, model=self._model, provider=self.provider_name
        )
        return await _messages(request.system, messages, reader)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream one Chat Completions call as ModelEvents."""
        if self._closed:
            raise ProviderError(
                f"the provider for model {self._model!r} is closed", provider=self.provider_name
            )
        text: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, _PartialCall] = {}
        usage: Usage | None = None
        finish_reason: str | None = None
        done: list[ToolCall] | None = None
        with translate_errors(
            provider=self.provider_name, model=self._model, secrets=self._secrets
        ):
            chunks = await self._open(request)
            try:
                async for chunk in chunks:
                    if not isinstance(chunk, dict):
                        raise self._malformed("a chunk that is not a JSON object")
                    counted = chunk.get("usage")
                    if counted:
                        usage = _usage(counted)
                    for choice in chunk.get("choices") or ():
                        if not isinstance(choice, dict):
                            raise self._malformed("a choice that is not a JSON object")
                        if choice.get("index", 0) != 0:
                            continue
                        delta = choice.get("delta") or _EMPTY
                        if not isinstance(delta, dict):
                            raise self._malformed("a delta that is not a JSON object")
                        thought = delta.get("reasoning_content")
                        if thought and isinstance(thought, str):
                            reasoning.append(thought)
                            yield ModelEvent.reasoning(thought)
                        piece = delta.get("content") or delta.get("refusal")
                        if piece:
                            if not isinstance(piece, str):
                                raise self._malformed("content that is not a string")
                            text.append(piece)
                            yield ModelEvent.text(piece)
                        fragments = delta.get("tool_calls")
                        if fragments:
                            self._gather(calls, fragments)
                        reason = choice.get("finish_reason")
                        if reason is not None:
                            finish_reason = str(reason)
                    if finish_reason is not None and done is None and calls:
                        # the calls are complete: yield them now, usage may still follow
                        done = self._complete(calls)
                        for call in done:
                            yield ModelEvent.tool_call(call)
            finally:
                await chunks.close()
        if finish_reason is None:
            raise stream_ended_early(
                chunks.response,
                provider=self.provider_name,
                model=self._model,
                marker="finish_reason",
            )
        if done is None:
            done = self._complete(calls)
            for call in done:
                yield ModelEvent.tool_call(call)
        message = AssistantMessage(
            "".join(text) or None, done, reasoning="".join(reasoning) or None
        )
        yield ModelEvent.completed(ModelResponse(message, usage, finish_reason))

    def _gather(self, calls: dict[int, _PartialCall], fragments: Any) -> None:
        """Add one chunk's tool-call fragments to the calls being assembled."""
        if not isinstance(fragments, list):
            raise self._malformed("tool_calls that are not a list")
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise self._malformed("a tool call that is not a JSON object")
            index = fragment.get("index", 0)
            if not isinstance(index, int):
                raise self._malformed("a tool call whose index is not an integer")
            call_id = fragment.get("id")
            partial = calls.get(index)
            if partial is None:
                partial = _PartialCall(
                    call_id
                    if isinstance(call_id, str) and call_id
                    else f"call_{secrets.token_hex(12)}"
                )
                calls[index] = partial
            elif isinstance(call_id, str) and call_id:
                partial.id = call_id
            function = fragment.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                if isinstance(name, str):
                    partial.name += name
                arguments = function.get("arguments")
                if isinstance(arguments, str) and arguments:
                    partial.fragments.append(arguments)

    def _malformed(self, what: str) -> ProviderError:
        return ProviderError(
            f"model {self._model!r} sent {what} in its stream",
            provider=self.provider_name,
            reason=MALFORMED_RESPONSE,
        )

    def _complete(self, calls: Mapping[int, _PartialCall]) -> list[ToolCall]:
        finished: list[ToolCall] = []
        for index in sorted(calls):
            partial = calls[index]
            if not partial.name:
                raise ProviderError(
                    f"model {self._model!r} sent a tool call without a name",
                    provider=self.provider_name,
                )
            finished.append(
                ToolCall(
                    partial.id,
                    partial.name,
                    parse_arguments("".join(partial.fragments), partial.name, self._model),
                )
            )
        return finished


def parse_arguments(raw: str, name: str, model: str, provider: str = "openai") -> dict[str, Any]:
    """Decode a tool call's JSON arguments; an empty string is no arguments."""
    if not raw.strip():
        return {}
    problem: str | None = None
    try:
        decoded = json.loads(raw)
    except json.JSONDecodeError as exc:
        problem = f"{exc.msg} at character {exc.pos}"
    if problem is not None:
        # raised outside the handler so that nothing chains the decoder error: it keeps the
        # raw text, which is the model's and may echo anything
        raise ProviderError(
            f"model {model!r} sent arguments for tool {name!r} that are not valid JSON ({problem})",
            provider=provider,
        )
    if not isinstance(decoded, dict):
        raise ProviderError(
            f"model {model!r} sent arguments for tool {name!r} that are not a JSON object",
            provider=provider,
        )
    return cast(dict[str, Any], decoded)


async def _messages(
    system: str | None, messages: Sequence[Message], reader: MediaReader
) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": system})
    # this turn's tool results that came with images or documents (see _flush)
    results: list[ToolMessage] = []
    for message in messages:
        if results and not isinstance(message, ToolMessage):
            await _flush(wire, results, reader)
        if isinstance(message, SystemMessage):
            wire.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            content = message.content
            wire.append(
                {
                    "role": "user",
                    "content": content
                    if isinstance(content, str)
                    else await content_array(content, reader),
                }
            )
        elif isinstance(message, AssistantMessage):
            item: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.arguments, ensure_ascii=False),
                        },
                    }
                    for call in message.tool_calls
                ]
            elif item["content"] is None:
                item["content"] = ""
            wire.append(item)
        elif isinstance(message, ToolMessage):
            wire.append(
                {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
            )
            if message.parts:
                results.append(message)
    if results:
        await _flush(wire, results, reader)
    return wire


async def _flush(
    wire: list[dict[str, Any]], results: list[ToolMessage], reader: MediaReader
) -> None:
    """The images and documents of a turn's tool results, as one user message after them.

    A tool message takes text only on this wire, and every tool result of a turn must follow
    its assistant message before any other message: so they come after the turn's last one.
    """
    carried = await tool_media_message(results, reader)
    if carried is not None:
        wire.append(carried)
    results.clear()


def _json_bytes(body: dict[str, Any]) -> bytes:
    """The body as the SDK itself would encode it (httpx's JSON defaults)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _response_format(output: OutputSchema) -> dict[str, Any]:
    """Structured output, natively: the answer's text is JSON matching the schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": output.name, "schema": output.schema, "strict": output.strict},
    }


def _usage(counted: Any) -> Usage | None:
    if not isinstance(counted, dict):
        return None
    prompt = counted.get("prompt_tokens")
    completion = counted.get("completion_tokens")
    return Usage(
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
        cached_input_tokens=_detail(counted, "prompt_tokens_details", "cached_tokens"),
        cache_write_tokens=_detail(counted, "prompt_tokens_details", "cache_write_tokens"),
        reasoning_tokens=_detail(counted, "completion_tokens_details", "reasoning_tokens"),
    )


def _detail(counted: dict[str, Any], group: str, name: str) -> int | None:
    """One count of a usage's details object; None where the host does not report it."""
    details = counted.get(group)
    value = details.get(name) if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        for spec in tools
    ]
