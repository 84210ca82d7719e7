"""Request bodies of the OpenAI-compatible endpoints (what the ``openai`` SDKs send).

Sampling parameters (the agent's configuration decides them) are accepted, so an SDK call that
sets them still works; parameters whose meaning the service cannot keep (client-side ``tools``,
``n``, log probabilities: ``app.http.protocols.openai.parameters``) are refused with a message
that says why. Text and ids are held to the
native run start's rules (``app.http.protocols.common.check_text``); a refusal of one is a 400
``invalid_request_error`` naming the field in ``param``, as OpenAI's API refuses a bad value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from app.errors import InvalidRequest, PayloadTooLarge, ServiceError
from app.http.api.errors import openai_error_body
from app.http.protocols.common import RefusedValue

__all__ = [
    "ApprovalAnswer",
    "ChatCompletionRequest",
    "ResponsesRequest",
    "StreamOptions",
    "invalid_value",
    "message_text",
    "refuse_client_tools",
]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Open(BaseModel):
    # the parameters beyond these fields are kept (``model_extra``): each is honoured, echoed
    # or refused (``app.http.protocols.openai.parameters``), never silently dropped
    model_config = ConfigDict(extra="allow")


class ResponsesRequest(_Open):
    """``POST /openai/v1/responses``."""

    model: str = Field(min_length=1, max_length=64, description="The agent's name")
    input: str | list[dict[str, Any]] = Field(
        description="A string, or input items: messages and mcp_approval_response items"
    )
    instructions: str | None = Field(
        default=None, max_length=100_000, description="Replaces the agent's system prompt"
    )
    previous_response_id: str | None = Field(
        default=None, max_length=200, description="Continue that response's session"
    )
    conversation: str | dict[str, Any] | None = Field(
        default=None, description="A session id (or {id}) to run in"
    )
    stream: bool = False
    background: bool = False
    store: bool | None = Field(
        default=None,
        description="false: a stateless call, whose session is kept only for the retention",
    )
    metadata: dict[str, str] | None = None
    tools: list[Any] | None = None
    text: dict[str, Any] | None = Field(
        default=None, description="text.format: text, json_object or json_schema"
    )


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Open):
    """``POST /openai/v1/chat/completions``."""

    model: str = Field(min_length=1, max_length=64, description="The agent's name")
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, str] | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = Field(
        default=None, description="text, json_object or json_schema"
    )


class ApprovalAnswer(BaseModel):
    """An ``mcp_approval_response`` input item."""

    approval_request_id: str
    approve: bool


def refuse_client_tools(tools: list[Any] | None) -> None:
    """The agent's tools run on the server; tools the client defines cannot be honoured."""
    if tools:
        raise InvalidRequest(
            "tools: this server runs the agent's own tools; tools defined by the client are "
            "not supported (leave tools empty)"
        )


def message_text(content: Any) -> str:
    """The text of a system or developer message's ``content``: a string, or text parts
    (instructions are text: other parts are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise InvalidRequest(
                    f"content part of type {kind!r} is not supported in instructions: a "
                    "system or developer message takes text parts only"
                )
        return "".join(texts)
    raise InvalidRequest("a message's content must be a string or a list of text parts")


def invalid_value(exc: ServiceError) -> Response:
    """The 400 answering a refused value or part of the input (``RefusedValue``, or the
    intake's refusal of an image or a document), ``param`` naming its field, as OpenAI's API
    answers a bad value; 413 for media over the run's limit."""
    status = 413 if isinstance(exc, PayloadTooLarge) else 400
    body = openai_error_body(status, exc.code, exc.detail)
    param = exc.param if isinstance(exc, RefusedValue) else exc.extra.get("param")
    body["error"]["param"] = param if isinstance(param, str) else None
    return JSONResponse(body, status_code=status)
