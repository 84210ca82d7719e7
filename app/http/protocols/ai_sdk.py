"""The Vercel AI SDK's UI message stream (v1), as ``useChat`` / ``DefaultChatTransport`` speak
it, read from the run's event log:

- ``POST /v1/agents/{agent}/ai-sdk/chat``: ``{id, messages, trigger, messageId}``; ``id`` is
  the session. A last ``user`` message starts a run; a last ``assistant`` message carrying
  tool parts in state ``approval-responded`` answers the run's confirmations and streams the
  rest of it.
- ``GET /v1/agents/{agent}/ai-sdk/chat/{id}/stream``: the session's active run from its start
  (``useChat({resume: true})``); 204 when there is none.
- ``POST /v1/agents/{agent}/ai-sdk/chat/{id}/stop``: cancel the session's active run.

The assistant message's id is our run's id, so a replay rebuilds the same message. See
docs/protocols.md for the full mapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.bus.base import WireEvent
from app.bus.wire import encode_data
from app.errors import InvalidRequest, NotFound, SessionBusy
from app.http.api.schemas import SESSION_ID_PATTERN, SessionId, unicode_text
from app.http.protocols.bodies import OffLoopJSONRoute
from app.http.protocols.common import (
    active_run,
    answer_confirmation,
    busy_reason,
    delta_string,
    disconnect_policy,
    event_data,
    latest_run,
    read_log,
    start_run,
    stream_run,
)
from app.http.protocols.media import (
    NativePart,
    PartRefused,
    has_media,
    media_part,
    parts_text,
    run_input,
    text_part,
)
from app.runs import RunRequestOptions
from app.server.services import ServicesDep

__all__ = ["UI_MESSAGE_STREAM_HEADERS", "UIMessageStreamEncoder", "router"]

# described by the protocol's own specification, not in /openapi.json
router = APIRouter(tags=["Vercel AI SDK"], include_in_schema=False, route_class=OffLoopJSONRoute)

Principal = Annotated[str, Depends(principal_of)]

UI_MESSAGE_STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}

_DONE = b"data: [DONE]\n\n"


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class UIPart(_Loose):
    """A part of a UI message (only what the server reads)."""

    type: str
    text: str | None = None
    toolCallId: str | None = None
    state: str | None = None
    approval: dict[str, Any] | None = None
    mediaType: str | None = None
    url: str | None = None
    filename: str | None = None


class UIMessage(_Loose):
    """A UI message."""

    id: str | None = None
    role: str
    parts: list[UIPart] = Field(default_factory=list)


class ChatRequest(_Loose):
    """What ``DefaultChatTransport`` posts, and the native run request's options it may add
    (its ``body`` option): ``on_disconnect``, ``run_timeout``, ``max_iterations``."""

    id: str = Field(pattern=SESSION_ID_PATTERN)
    messages: list[UIMessage] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    run_timeout: float | None = Field(default=None, gt=0)
    max_iterations: int | None = Field(default=None, ge=1)

    # held to the native run start's rules (NUL, a lone surrogate, a number out of range),
    # anywhere in the body: 422 validation_error, as there
    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data)


def _part(chunk: dict[str, Any]) -> bytes:
    return b"data: " + encode_data(chunk).encode() + b"\n\n"


def user_parts(message: UIMessage, param: str) -> list[NativePart]:
    """A user message's ``text`` and ``file`` parts as native parts, in order.

    A ``file`` part's ``url`` is a data URL or an https URL; its ``mediaType`` says whether it
    is an image or a document (a data URL must agree with it). Any other part is refused:
    nothing a user sent is dropped.
    """
    parts: list[NativePart] = []
    for index, part in enumerate(message.parts):
        where = f"{param}[{index}]"
        if part.type == "text":
            if part.text:
                parts.append(text_part(part.text))
        elif part.type == "file":
            if not part.mediaType:
                raise PartRefused(where, f"{where}: a file part needs its mediaType")
            parts.append(
                media_part(
                    where,
                    url=part.url or "",
                    media_type=part.mediaType,
                    filename=part.filename,
                )
            )
        else:
            raise PartRefused(
                where,
                f"{where}: a part of type {part.type!r} cannot be sent to the agent; a user "
                "message takes text and file parts",
            )
    return parts


def _approvals(message: UIMessage) -> list[tuple[str, bool]]:
    answers = []
    for part in message.parts:
        if part.state != "approval-responded" or part.toolCallId is None:
            continue
        approved = (part.approval or {}).get("approved")
        if not isinstance(approved, bool):
            raise InvalidRequest(
                f"messages: the approval of tool call {part.toolCallId!r} needs approved: boolean"
            )
        answers.append((part.toolCallId, approved))
    return answers


@router.post(
    "/v1/agents/{agent}/ai-sdk/chat",
    summary="Chat with an agent over the AI SDK UI message stream",
)
async def chat(
    agent: str, body: ChatRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run for the last user message, or answer the run's tool approvals and stream
    the rest of it."""
    services.manager.profile(agent)
    last = body.messages[-1]
    on_gone_policy = body.on_disconnect
    if last.role == "assistant":
        answers = _approvals(last)
        if not answers:
            raise InvalidRequest(
                "messages: the last message must be a user message, or an assistant message "
                "with tool approval responses"
            )
        run_id = await latest_run(services, body.id, principal)
        if run_id is None:
            raise NotFound(f"chat {body.id!r} has no run waiting for an approval")
        logged = await read_log(services, run_id)
        unknown = [call_id for call_id, _ in answers if call_id not in logged.confirmations]
        if unknown:
            raise NotFound(f"no approval {unknown[0]!r} in the latest run of chat {body.id!r}")
        for call_id, approved in answers:
            if logged.confirmations[call_id].outcome is None and not logged.ended:
                await answer_confirmation(services, principal, body.id, run_id, call_id, approved)
        after = min(logged.confirmations[call_id].seq for call_id, _ in answers)
        return stream_run(
            services,
            run_id,
            UIMessageStreamEncoder(run_id, after=after),
            after=after,
            on_gone=disconnect_policy(services, run_id, on_gone_policy),
            headers=UI_MESSAGE_STREAM_HEADERS,
        )
    if last.role != "user":
        raise InvalidRequest("messages: the last message must be a user message")
    index = len(body.messages) - 1
    parts = user_parts(last, f"messages[{index}].parts")
    if not (has_media(parts) or parts_text(parts).strip()):
        raise InvalidRequest("messages: the last user message has no text or file part")
    taken = await run_input(services, principal, parts)
    # regenerate: the new run takes the place of the latest turn (the client dropped its
    # answer), so the model does not see the answer it replaces
    replaces = None
    if body.trigger == "regenerate-message":
        replaces = await latest_run(services, body.id, principal)
    options = RunRequestOptions(
        input=taken.text,
        parts=taken.parts,
        agent=agent,
        on_disconnect=body.on_disconnect,
        run_timeout=body.run_timeout,
        max_iterations=body.max_iterations,
        metadata={"ai_sdk": {"trigger": body.trigger}},
        replaces=replaces,
    )
    try:
        async with taken:
            handle = await start_run(services, principal, body.id, options)
    except SessionBusy as exc:
        if await busy_reason(services, exc, principal) == "interrupt_pending":
            raise SessionBusy(
                f"chat {body.id!r} has a tool approval pending: answer it before sending a new "
                "message",
                extra=exc.extra,
                code="approval_pending",
            ) from None
        raise
    return stream_run(
        services,
        handle.run_id,
        UIMessageStreamEncoder(handle.run_id),
        on_gone=disconnect_policy(services, handle.run_id, body.on_disconnect),
        headers=UI_MESSAGE_STREAM_HEADERS,
    )


@router.get(
    "/v1/agents/{agent}/ai-sdk/chat/{chat_id}/stream",
    summary="Resume the chat's active stream",
)
async def resume_stream(
    agent: str, chat_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """The chat's active run from its start; 204 when it has none."""
    services.manager.profile(agent)
    run_id = await active_run(services, chat_id, principal)
    if run_id is None or not await services.bus.events.exists(run_id):
        return Response(status_code=204)
    return stream_run(
        services, run_id, UIMessageStreamEncoder(run_id), headers=UI_MESSAGE_STREAM_HEADERS
    )


@router.post(
    "/v1/agents/{agent}/ai-sdk/chat/{chat_id}/stop",
    summary="Stop the chat's active run",
    status_code=202,
)
async def stop(
    agent: str, chat_id: SessionId, principal: Principal, services: ServicesDep
) -> Response:
    """Cancel the chat's active run (reason ``cancel_requested``); 204 when it has none."""
    services.manager.profile(agent)
    run_id = await active_run(services, chat_id, principal)
    if run_id is None:
        return Response(status_code=204)
    answer = await services.manager.cancel(run_id, principal)
    if answer is None:
        return Response(status_code=204)
    state, status = answer
    if state == "finished":
        return JSONResponse({"run_id": run_id, "status": status}, status_code=200)
    return JSONResponse({"run_id": run_id, "status": "cancelling"}, status_code=202)


class UIMessageStreamEncoder:
    """Our wire events → UI message stream parts, for one response (a window of our run's
    log, from ``after``).

    A step is one model call and the tool calls it made; the next model call, after tool
    results, opens the next step. A call's reasoning is a reasoning part at the start of its
    step. Text and reasoning deltas are re-framed without decoding.
    """

    __slots__ = (
        "_after",
        "_delta_prefix",
        "_denied",
        "_ended",
        "_pending",
        "_reasoning",
        "_reasoning_prefix",
        "_run_id",
        "_started",
        "_step",
        "_step_has_results",
        "_step_has_tools",
        "_text",
        "_usage",
    )

    def __init__(self, run_id: str, *, after: int = 0) -> None:
        self._run_id = run_id
        self._after = after
        self._started = False
        self._ended = False
        self._step = False
        self._step_has_tools = False
        self._step_has_results = False
        self._text: str | None = None
        self._delta_prefix = b""
        self._reasoning: str | None = None
        self._reasoning_prefix = b""
        self._pending: set[str] = set()
        self._denied: set[str] = set()
        self._usage: dict[str, int] = {}

    @property
    def done(self) -> bool:
        return self._ended

    @property
    def paused(self) -> bool:
        return bool(self._pending)

    def opening(self) -> bytes:
        self._started = True
        return _part(
            {"type": "start", "messageId": self._run_id, "messageMetadata": {"runId": self._run_id}}
        )

    def encode(self, batch: Sequence[WireEvent]) -> bytes:
        out: list[bytes] = [] if self._started else [self.opening()]
        for event in batch:
            if self._ended:
                break
            if event.type == "text.delta":
                self._delta(event, out)
            elif event.type == "reasoning.delta":
                self._reasoning_delta(event, out)
            else:
                self._event(event, out)
        return b"".join(out)

    def pause(self) -> bytes:
        out: list[bytes] = []
        self._finish(out, "tool-calls")
        return b"".join(out)

    # --- translation ----------------------------------------------------------------------

    def _open_step(self, out: list[bytes]) -> None:
        if self._step and self._step_has_results:
            self._close_step(out)
        if not self._step:
            out.append(b'data: {"type":"start-step"}\n\n')
            self._step = True
            self._step_has_tools = self._step_has_results = False

    def _close_step(self, out: list[bytes]) -> None:
        self._close_text(out)
        if self._step:
            out.append(b'data: {"type":"finish-step"}\n\n')
            self._step = False

    def _close_text(self, out: list[bytes]) -> None:
        self._close_reasoning(out)
        if self._text is not None:
            out.append(_part({"type": "text-end", "id": self._text}))
            self._text = None

    def _close_reasoning(self, out: list[bytes]) -> None:
        if self._reasoning is not None:
            out.append(_part({"type": "reasoning-end", "id": self._reasoning}))
            self._reasoning = None

    def _delta(self, event: WireEvent, out: list[bytes]) -> None:
        delta = delta_string(event)
        if delta == b"null":
            return
        if self._text is None:
            self._close_reasoning(out)
            self._open_step(out)
            text_id = f"{self._run_id}:m{event.seq}"
            self._text = text_id
            out.append(_part({"type": "text-start", "id": text_id}))
            self._delta_prefix = (
                b'data: {"type":"text-delta","id":"' + text_id.encode() + b'","delta":'
            )
        out.append(self._delta_prefix + delta + b"}\n\n")

    def _reasoning_delta(self, event: WireEvent, out: list[bytes]) -> None:
        delta = delta_string(event)
        if delta == b"null":
            return
        if self._reasoning is None:
            self._close_text(out)
            self._open_step(out)
            reasoning_id = f"{self._run_id}:reasoning{event.seq}"
            self._reasoning = reasoning_id
            out.append(_part({"type": "reasoning-start", "id": reasoning_id}))
            self._reasoning_prefix = (
                b'data: {"type":"reasoning-delta","id":"' + reasoning_id.encode() + b'","delta":'
            )
        out.append(self._reasoning_prefix + delta + b"}\n\n")

    def _event(self, event: WireEvent, out: list[bytes]) -> None:
        kind = event.type
        if kind == "run.started":
            return
        data = event_data(event)
        if kind == "usage":
            for name in _USAGE_FIELDS:
                value = data.get(name)
                if isinstance(value, int):
                    self._usage[name] = self._usage.get(name, 0) + value
            return
        if kind == "tool.call.started":
            self._close_text(out)
            self._open_step(out)
            self._step_has_tools = True
            out.append(
                _part(
                    {
                        "type": "tool-input-available",
                        "toolCallId": str(data.get("tool_call_id")),
                        "toolName": str(data.get("name")),
                        "input": data.get("arguments") or {},
                        "dynamic": True,
                    }
                )
            )
        elif kind == "tool.call.completed":
            self._close_text(out)
            call_id = str(data.get("tool_call_id"))
            self._step_has_results = True
            if call_id in self._denied:
                return  # already told: tool-output-denied
            if data.get("is_error"):
                out.append(
                    _part(
                        {
                            "type": "tool-output-error",
                            "toolCallId": call_id,
                            "errorText": str(data.get("error") or "the tool failed"),
                            "dynamic": True,
                        }
                    )
                )
            else:
                out.append(
                    _part(
                        {
                            "type": "tool-output-available",
                            "toolCallId": call_id,
                            "output": data.get("result"),
                            "dynamic": True,
                        }
                    )
                )
        elif kind == "custom":
            self._custom(data, out)
        elif kind == "run.completed":
            self._finish(out, "stop")
        elif kind == "run.failed":
            error = data.get("error") or {}
            self._close_step(out)
            message = str(error.get("message") or "the run failed")
            code = str(error.get("code") or "internal")
            out.append(_part({"type": "error", "errorText": f"{message} ({code})"}))
            self._finish(out, "error")
        elif kind == "run.cancelled":
            self._close_step(out)
            out.append(_part({"type": "abort", "reason": str(data.get("reason"))}))
            out.append(_DONE)
            self._ended = True
        elif kind == "run.resumed":
            # the run goes on elsewhere from its last checkpoint and redoes the model call it
            # was in: the text that call streamed here is superseded, so the step is reset
            self._close_text(out)
            if self._step and not self._step_has_tools:
                out.append(b'data: {"type":"reset-step"}\n\n')
            out.append(_part({"type": "data-run-resumed", "data": data, "transient": True}))
        else:
            out.append(_part({"type": f"data-{kind}", "data": data, "transient": True}))

    def _custom(self, data: dict[str, Any], out: list[bytes]) -> None:
        name = str(data.get("name"))
        payload = data.get("payload")
        call_id = payload.get("tool_call_id") if isinstance(payload, dict) else None
        if name == "confirmation_requested" and isinstance(call_id, str):
            self._close_text(out)
            self._pending.add(call_id)
            request: dict[str, Any] = {
                "type": "tool-approval-request",
                "approvalId": call_id,
                "toolCallId": call_id,
            }
            assert isinstance(payload, dict)
            if isinstance(payload.get("question"), str):
                request["reason"] = payload["question"]
            out.append(_part(request))
        elif name == "confirmation_resolved" and isinstance(call_id, str):
            self._pending.discard(call_id)
            assert isinstance(payload, dict)
            if payload.get("outcome") != "approved":
                self._denied.add(call_id)
                out.append(_part({"type": "tool-output-denied", "toolCallId": call_id}))
        out.append(_part({"type": f"data-{name}", "data": payload, "transient": True}))

    def _finish(self, out: list[bytes], reason: str) -> None:
        self._close_step(out)
        metadata = {"runId": self._run_id, "usage": language_model_usage(self._usage)}
        out.append(_part({"type": "finish", "finishReason": reason, "messageMetadata": metadata}))
        out.append(_DONE)
        self._ended = True
        self._pending.clear()


_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def language_model_usage(counts: dict[str, int]) -> dict[str, Any]:
    """Our usage counts in the shape of the AI SDK's ``LanguageModelUsage``: totals, and the
    input and output details where the provider reported them."""
    tokens_in = counts.get("input_tokens", 0)
    tokens_out = counts.get("output_tokens", 0)
    usage: dict[str, Any] = {
        "inputTokens": tokens_in,
        "outputTokens": tokens_out,
        "totalTokens": tokens_in + tokens_out,
    }
    cached = counts.get("cached_input_tokens")
    written = counts.get("cache_write_tokens")
    if cached is not None or written is not None:
        details = {"noCacheTokens": tokens_in - (cached or 0) - (written or 0)}
        if cached is not None:
            details["cacheReadTokens"] = cached
        if written is not None:
            details["cacheWriteTokens"] = written
        usage["inputTokenDetails"] = details
    reasoning = counts.get("reasoning_tokens")
    if reasoning is not None:
        usage["outputTokenDetails"] = {
            "textTokens": tokens_out - reasoning,
            "reasoningTokens": reasoning,
        }
    return usage
