"""``/openai/v1/chat/completions`` and ``/openai/v1/models``.

A chat completion is one run in a session of its own: the last user message is the run's input
(the agent's system prompt and tools are the server's; earlier messages are not replayed). The
session is stateless: not listed, and deleted once idle past ``AGENT_STATELESS_RETENTION``.
The agent's tool calls run on the server and do not appear as ``tool_calls``. A run that stops
for a confirmation cannot be answered here: the request fails with ``confirmation_required``
and the run is cancelled; the Responses endpoint carries confirmations.

Chat Completions has no field for a model's reasoning. The service sends it as
``reasoning_content`` (in the deltas, and in the message), the field DeepSeek's API introduced
and many clients and servers of this API read (vLLM, LiteLLM, Open WebUI, LangChain); a client
that does not know it ignores it. The usage's ``prompt_tokens_details`` (``cached_tokens``,
``cache_write_tokens``) and ``completion_tokens_details.reasoning_tokens`` are there where the
provider reported them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.errors import InvalidRequest, NotFound, ServiceError, UnsupportedMediaType
from app.http.api.errors import openai_error_body, status_of
from app.http.api.streaming import EventStreamResponse
from app.http.protocols.bodies import OffLoopJSONRoute
from app.http.protocols.common import (
    LogResultResponse,
    RefusedValue,
    TranslatingEncoder,
    cancel_on_disconnect,
    check_fields,
    dumps,
    new_session_id,
)
from app.http.protocols.media import NativePart, has_media, parts_text, run_input
from app.http.protocols.openai.parameters import chat_response_format, refuse_unhonoured_chat
from app.http.protocols.openai.parts import chat_content
from app.http.protocols.openai.schemas import (
    ChatCompletionRequest,
    invalid_value,
    refuse_client_tools,
)
from app.runs import RunRequestOptions
from app.server.services import ServicesDep

__all__ = ["ChatBuilder", "router"]

# not in /openapi.json: the OpenAI API reference describes these paths
router = APIRouter(tags=["openai"], include_in_schema=False, route_class=OffLoopJSONRoute)

Principal = Annotated[str, Depends(principal_of)]

_WAITING_EVENT = "confirmation_requested"
_DONE = b"data: [DONE]\n\n"
# the models' "created": when this process started (agents have no creation time of their own)
_STARTED = int(time.time())


class ConfirmationRequired(ServiceError):
    """The run stopped for a confirmation, which Chat Completions cannot carry."""

    code = "confirmation_required"


def _confirmation_error(tool: str) -> ConfirmationRequired:
    return ConfirmationRequired(
        f"the agent asked to confirm its call of the tool {tool!r}, which the Chat Completions "
        "API cannot carry; the run was cancelled. Use POST /openai/v1/responses, where the "
        "request is an mcp_approval_request answered with an mcp_approval_response"
    )


def _failure_error(data: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    error = data.get("error") or {}
    code = str(error.get("code") or "internal")
    status = 429 if code == "queue_timeout" else 500
    return status, openai_error_body(status, code, str(error.get("message") or "the run failed"))


class ChatBuilder:
    """A run's events as one assistant message: ``chat.completion.chunk`` frames (``stream``)
    and the ``chat.completion`` object."""

    def __init__(
        self,
        *,
        completion_id: str,
        model: str,
        stream: bool = False,
        include_usage: bool = False,
        on_confirmation: Callable[[], object] | None = None,
    ) -> None:
        self.done = False
        self._id = completion_id
        self._model = model
        self._created = int(time.time())
        self._stream = stream
        self._include_usage = include_usage
        self._on_confirmation = on_confirmation
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._counts: dict[str, int] = {}
        self._failure: tuple[int, dict[str, Any]] | None = None
        self._finish_reason = "stop"

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def _frame(self, value: Mapping[str, Any]) -> bytes:
        if not self._stream:
            return b""
        return b"data: " + dumps(value).encode() + b"\n\n"

    def _usage(self) -> dict[str, Any]:
        counts = self._counts
        prompt = counts.get("input_tokens", 0)
        completion = counts.get("output_tokens", 0)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        cached = {
            theirs: counts[ours]
            for ours, theirs in (
                ("cached_input_tokens", "cached_tokens"),
                ("cache_write_tokens", "cache_write_tokens"),
            )
            if ours in counts
        }
        if cached:
            usage["prompt_tokens_details"] = cached
        if "reasoning_tokens" in counts:
            usage["completion_tokens_details"] = {"reasoning_tokens": counts["reasoning_tokens"]}
        return usage

    def opening(self) -> bytes:
        return self._frame(self._chunk({"role": "assistant", "content": ""}))

    def feed(self, document: Mapping[str, Any]) -> bytes:
        if self.done:
            return b""
        type_ = document["type"]
        data: Mapping[str, Any] = document.get("data") or {}
        if type_ == "text.delta":
            delta = str(data.get("delta") or "")
            self._text.append(delta)
            return self._frame(self._chunk({"content": delta}))
        if type_ == "reasoning.delta":
            delta = str(data.get("delta") or "")
            self._reasoning.append(delta)
            return self._frame(self._chunk({"reasoning_content": delta}))
        if type_ == "usage":
            for name in _USAGE_FIELDS:
                value = data.get(name)
                if isinstance(value, int):
                    self._counts[name] = self._counts.get(name, 0) + value
            return b""
        if type_ == "custom" and data.get("name") == _WAITING_EVENT:
            payload = data.get("payload") or {}
            error = _confirmation_error(str(payload.get("tool") or ""))
            status = status_of(error)
            self._fail(status, openai_error_body(status, error.code, error.detail))
            if self._on_confirmation is not None:
                self._on_confirmation()
            return self._frame(self._failure[1] if self._failure else {})
        if type_ == "run.completed":
            output = data.get("output")
            # a structured answer is the run's validated text: not an attempt it retried
            if isinstance(output, Mapping) and "structured" in output:
                content = output.get("content")
                self._text = [content] if isinstance(content, str) else self._text
            self.done = True
            frames = self._frame(self._chunk({}, "stop"))
            if self._include_usage:
                frames += self._frame({**self._chunk({}), "choices": [], "usage": self._usage()})
            return frames + (_DONE if self._stream else b"")
        if type_ == "run.failed":
            status, body = _failure_error(data)
            self._fail(status, body)
            return self._frame(body)
        if type_ == "run.cancelled":
            reason = str(data.get("reason") or "cancel_requested")
            self._fail(
                409, openai_error_body(409, "cancelled", f"the run was cancelled ({reason})")
            )
            return self._frame(self._failure[1] if self._failure else {})
        return b""

    def _fail(self, status: int, body: dict[str, Any]) -> None:
        if self._failure is None:
            self._failure = (status, body)
        self.done = True

    def result(self) -> tuple[int, dict[str, Any]]:
        """The ``chat.completion`` (or the error that ended the run)."""
        if self._failure is not None:
            return self._failure
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text),
            "refusal": None,
            "annotations": [],
        }
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        return 200, {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self._finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self._usage(),
        }


_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def _last_user_parts(messages: list[dict[str, Any]]) -> list[NativePart]:
    """The last user message's parts (text, images, files): the run's input."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "user":
            parts = chat_content(message.get("content"), f"messages[{index}].content")
            if has_media(parts) or parts_text(parts, "").strip():
                return parts
            break
    raise InvalidRequest("messages: the last user message must have content")


@router.post("/openai/v1/chat/completions", summary="Create a chat completion (run an agent)")
async def create_chat_completion(
    body: ChatCompletionRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Run agent ``model`` on the last user message, in a new session."""
    try:
        check_fields(body)
        refuse_unhonoured_chat(body.model_extra or {})
        response_format = chat_response_format(body.response_format)
        parts = _last_user_parts(body.messages)
    except (RefusedValue, UnsupportedMediaType) as exc:  # a bad value or part
        return invalid_value(exc)
    refuse_client_tools(body.tools)
    manager = services.manager
    manager.profile(body.model)  # an unknown model is a 404 before any file is stored
    try:
        taken = await run_input(services, principal, parts, separator="")
    except ServiceError as exc:
        return invalid_value(exc)
    async with taken:
        handle = await manager.start(
            principal,
            new_session_id("chat"),
            RunRequestOptions(
                input=taken.text,
                parts=taken.parts,
                agent=body.model,
                metadata=body.metadata or {},
                stateless=True,
                response_format=response_format,
            ),
        )
    run_id = handle.run_id
    cancel = cancel_on_disconnect(manager, handle)

    def on_confirmation() -> None:
        manager.cancel_local(run_id, "cancel_requested")

    builder = ChatBuilder(
        completion_id=f"chatcmpl-{run_id.removeprefix('run_')}",
        model=body.model,
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        on_confirmation=on_confirmation,
    )
    headers = {"X-Run-Id": run_id}
    if body.stream:
        return EventStreamResponse(
            events=services.bus.events,
            run_id=run_id,
            headers=headers,
            ping=services.settings.sse_ping,
            send_timeout=services.settings.send_timeout,
            on_gone=cancel,
            manager=manager,
            encoder=TranslatingEncoder(builder),
        )
    return LogResultResponse(
        events=services.bus.events,
        run_id=run_id,
        translator=builder,
        result=builder.result,
        headers=headers,
        on_gone=cancel,
        manager=manager,
    )


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "agent-server"}


@router.get("/openai/v1/models", summary="List models (the configured agents)")
async def list_models(principal: Principal, services: ServicesDep) -> Response:
    """One model per configured agent; its id is the agent's name."""
    names = sorted(services.agents.profiles)
    return JSONResponse({"object": "list", "data": [_model(name) for name in names]})


@router.get("/openai/v1/models/{model}", summary="Retrieve a model (an agent)")
async def retrieve_model(model: str, principal: Principal, services: ServicesDep) -> Response:
    """The agent ``model``, as a model."""
    if model not in services.agents.profiles:
        raise NotFound(f"no model {model!r}: the models are the configured agents")
    return JSONResponse(_model(model))
