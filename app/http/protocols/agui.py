"""AG-UI 1.0: ``POST /v1/agents/{agent}/ag-ui`` takes a ``RunAgentInput`` and answers the run
as AG-UI events, ``data: {json}`` frames, read from the run's event log.

An AG-UI run is a window onto one of ours. ``threadId`` is the session; the input is the last
``user`` message (the conversation is the session's, so history sent along is not stored
twice). A confirmation ends the AG-UI run with ``RUN_FINISHED`` outcome ``interrupt`` while our
run waits; the next request on the thread answers it with ``resume`` and streams the rest of
our run from the log, as a new AG-UI run. See docs/protocols.md for the full mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.responses import Response

from app.auth.keys import principal_of
from app.bus.base import WireEvent
from app.bus.wire import encode_data
from app.errors import InvalidRequest, NotFound, ServiceError, SessionBusy
from app.http.api.schemas import SESSION_ID_PATTERN, unicode_text
from app.http.protocols.bodies import OffLoopJSONRoute
from app.http.protocols.common import (
    SSE_HEADERS,
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
    FILE_PROVIDER,
    NativePart,
    PartRefused,
    data_url,
    has_media,
    media_part,
    parts_text,
    run_input,
    text_part,
    unsupported_kind,
)
from app.runs import RunRequestOptions
from app.server.services import Services, ServicesDep

__all__ = ["AgUiEncoder", "router"]

# described by the protocol's own specification, not in /openapi.json
router = APIRouter(tags=["AG-UI"], include_in_schema=False, route_class=OffLoopJSONRoute)

Principal = Annotated[str, Depends(principal_of)]

PROTOCOL_VERSION = "1.0"

# the answer an interrupt of ours expects
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class AgUiMessage(_Loose):
    """A message of ``RunAgentInput.messages`` (only ``role`` and ``content`` are read)."""

    id: str | None = None
    role: str
    content: str | list[dict[str, Any]] | None = None


class ResumeEntry(_Loose):
    """An answer to one interrupt."""

    interruptId: str = Field(min_length=1, max_length=256)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class RunAgentInput(_Loose):
    """AG-UI's request body."""

    threadId: str = Field(pattern=SESSION_ID_PATTERN)
    runId: str = Field(min_length=1, max_length=256)
    messages: list[AgUiMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    context: list[dict[str, Any]] = Field(default_factory=list)
    forwardedProps: dict[str, Any] | None = None
    resume: list[ResumeEntry] | None = None

    # held to the native run start's rules (NUL, a lone surrogate, a number out of range),
    # anywhere in the body: 422 validation_error, as there
    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return unicode_text(data)


def _frame(event: dict[str, Any]) -> bytes:
    return b"data: " + encode_data(event).encode() + b"\n\n"


def _refusal(code: str, message: str) -> Response:
    """A stream of one ``RUN_ERROR``: AG-UI's own shape for a run that cannot start."""
    body = _frame({"type": "RUN_ERROR", "message": message, "code": code})
    return Response(body, media_type="text/event-stream", headers=SSE_HEADERS)


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def user_parts(message: AgUiMessage, param: str) -> list[NativePart]:
    """A user message's content as native parts, in order: ``text``, and ``image`` and
    ``document`` parts whose ``source`` is ``data`` (base64 and its ``mimeType``), ``url``
    (https or data) or ``file`` (the id of one of the caller's files); also the draft's
    ``binary`` part (``mimeType`` and one of ``data``, ``url``, ``id``).

    ``audio`` and ``video`` parts, and anything else, are refused: nothing a user sent is
    dropped.
    """
    content = message.content
    if isinstance(content, str):
        return [text_part(content)] if content else []
    parts: list[NativePart] = []
    for index, part in enumerate(content or ()):
        where = f"{param}[{index}]"
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise PartRefused(where, f"{where}: a text part needs its text")
            if text:
                parts.append(text_part(text))
        elif kind in ("image", "document"):
            parts.append(_sourced(part, where, "image" if kind == "image" else "file"))
        elif kind == "binary":
            parts.append(_binary(part, where))
        elif kind in ("audio", "video"):
            raise unsupported_kind(where, kind)
        else:
            raise PartRefused(
                where,
                f"{where}: a part of type {kind!r} cannot be sent to the agent; a user message "
                "takes text, image and document parts",
            )
    return parts


def _sourced(part: dict[str, Any], where: str, kind: Literal["image", "file"]) -> NativePart:
    source = part.get("source")
    if not isinstance(source, dict):
        raise PartRefused(where, f"{where}: an image or document part needs its source")
    origin = source.get("type")
    value = _string(source.get("value"))
    mime = _string(source.get("mimeType"))
    metadata = part.get("metadata")
    filename = _string(metadata.get("filename")) if isinstance(metadata, dict) else None
    if value is None:
        raise PartRefused(f"{where}.source", f"{where}.source: a source needs its value")
    if origin == "data":
        if not mime:
            raise PartRefused(
                f"{where}.source", f"{where}.source: a data source needs its mimeType"
            )
        url = data_url(mime, value)
        return media_part(where, url=url, media_type=mime, filename=filename, kind=kind)
    if origin == "url":
        return media_part(where, url=value, media_type=mime, filename=filename, kind=kind)
    if origin == "file":
        provider = _string(source.get("provider"))
        if provider not in (None, FILE_PROVIDER):
            raise PartRefused(
                f"{where}.source",
                f"{where}.source: a file handle of {provider!r} cannot be read here; give "
                f"the file_id of a file uploaded to POST /v1/files (provider {FILE_PROVIDER!r}"
                ") or the bytes",
            )
        return media_part(where, file_id=value, media_type=mime, filename=filename, kind=kind)
    raise PartRefused(
        f"{where}.source", f"{where}.source: a source's type is data, url or file, not {origin!r}"
    )


def _binary(part: dict[str, Any], where: str) -> NativePart:
    mime = _string(part.get("mimeType"))
    if not mime:
        raise PartRefused(where, f"{where}: a binary part needs its mimeType")
    data, url, file_id = (_string(part.get(key)) for key in ("data", "url", "id"))
    if sum(value is not None for value in (data, url, file_id)) != 1:
        raise PartRefused(where, f"{where}: a binary part needs exactly one of data, url and id")
    return media_part(
        where,
        url=data_url(mime, data) if data is not None else url,
        file_id=file_id,
        media_type=mime,
        filename=_string(part.get("filename")),
    )


class RunProps(BaseModel):
    """What ``forwardedProps`` may ask of the run (the native run request's options)."""

    model_config = ConfigDict(extra="ignore")

    on_disconnect: Literal["cancel", "continue"] = "cancel"
    run_timeout: float | None = Field(default=None, gt=0)
    max_iterations: int | None = Field(default=None, ge=1)


def _props(body: RunAgentInput) -> RunProps:
    try:
        return RunProps.model_validate(body.forwardedProps or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InvalidRequest(f"forwardedProps.{where}: {first['msg']}") from None


@router.post(
    "/v1/agents/{agent}/ag-ui",
    summary="Run an agent over AG-UI 1.0",
)
async def run_agent(
    agent: str, body: RunAgentInput, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run in the thread (or, with ``resume``, answer its interrupts and go on),
    answered as AG-UI events."""
    services.manager.profile(agent)  # 404 for an agent that is not configured
    if body.tools:
        names = ", ".join(str(tool.get("name")) for tool in body.tools)
        raise InvalidRequest(
            f"client-side tools are not supported ({names}): this agent's tools run on the "
            "server; send tools: [] and configure tools on the agent"
        )
    props = _props(body)
    on_disconnect = props.on_disconnect
    if body.resume:
        return await _resume(services, principal, body, on_disconnect)
    found = next(
        ((i, m) for i, m in reversed(list(enumerate(body.messages))) if m.role == "user"), None
    )
    if found is None:
        raise InvalidRequest("messages: the input needs a user message with content")
    param = f"messages[{found[0]}].content"
    # a part the run cannot take, or a file that cannot be stored: the protocol's own
    # RUN_ERROR, as for a run that cannot start
    try:
        parts = user_parts(found[1], param)
    except ServiceError as exc:
        return _refusal(exc.code, exc.detail)
    if not (has_media(parts) or parts_text(parts).strip()):
        raise InvalidRequest("messages: the input needs a user message with content")
    try:
        taken = await run_input(services, principal, parts)
    except ServiceError as exc:
        return _refusal(exc.code, exc.detail)
    options = RunRequestOptions(
        input=taken.text,
        parts=taken.parts,
        agent=agent,
        on_disconnect=on_disconnect,
        run_timeout=props.run_timeout,
        max_iterations=props.max_iterations,
        metadata={"ag_ui": {"runId": body.runId}},
    )
    try:
        async with taken:
            handle = await start_run(services, principal, body.threadId, options)
    except SessionBusy as exc:
        code = await busy_reason(services, exc, principal)
        if code == "interrupt_pending":
            message = (
                f"thread {body.threadId!r} has a pending interrupt: answer it with resume "
                "before sending new input"
            )
        else:
            message = exc.detail
        return _refusal(code, message)
    encoder = AgUiEncoder(body.threadId, body.runId, handle.run_id)
    return stream_run(
        services,
        handle.run_id,
        encoder,
        on_gone=disconnect_policy(services, handle.run_id, on_disconnect),
    )


def _approved(entry: ResumeEntry) -> bool:
    if entry.status == "cancelled":
        return False
    payload = entry.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise InvalidRequest(
            f"resume: the payload answering {entry.interruptId!r} must be {{approved: boolean}}"
        )
    return bool(payload["approved"])


async def _resume(
    services: Services,
    principal: str,
    body: RunAgentInput,
    on_disconnect: Literal["cancel", "continue"],
) -> Response:
    thread = body.threadId
    answers = [(entry.interruptId, _approved(entry)) for entry in body.resume or ()]
    run_id = await latest_run(services, thread, principal)
    if run_id is None:
        return _refusal("not_found", f"thread {thread!r} has no run to resume")
    try:
        logged = await read_log(services, run_id)
    except NotFound as exc:
        return _refusal("not_found", exc.detail)
    unknown = [call_id for call_id, _ in answers if call_id not in logged.confirmations]
    if unknown:
        return _refusal(
            "not_found", f"no interrupt {unknown[0]!r} in the latest run of thread {thread!r}"
        )
    for call_id, approved in answers:
        if logged.confirmations[call_id].outcome is None and not logged.ended:
            # a repeated resume finds it resolved and only replays; a refused answer (just
            # expired, answered elsewhere) shows as what the log says happened
            try:
                await answer_confirmation(services, principal, thread, run_id, call_id, approved)
            except ServiceError as exc:
                return _refusal(exc.code, exc.detail)
    after = min(logged.confirmations[call_id].seq for call_id, _ in answers)
    encoder = AgUiEncoder(thread, body.runId, run_id, model=logged.model, after=after)
    return stream_run(
        services,
        run_id,
        encoder,
        after=after,
        on_gone=disconnect_policy(services, run_id, on_disconnect),
    )


class AgUiEncoder:
    """Our wire events → AG-UI events, for one AG-UI run (a window of our run's log).

    Text and reasoning deltas are re-framed without decoding (their JSON string is reused as
    it is); the other events are decoded and translated one by one. A model call's reasoning
    is one reasoning message in a span of its own (``REASONING_START`` ...
    ``REASONING_END``), closed by whatever the call does next.
    """

    __slots__ = (
        "_after",
        "_calls",
        "_content_prefix",
        "_ended",
        "_model",
        "_parent",
        "_pending",
        "_reasoning",
        "_reasoning_prefix",
        "_run_id",
        "_started",
        "_text",
        "_thread_id",
        "_usage",
        "client_run_id",
    )

    def __init__(
        self,
        thread_id: str,
        client_run_id: str,
        run_id: str,
        *,
        model: str | None = None,
        after: int = 0,
    ) -> None:
        self._thread_id = thread_id
        self.client_run_id = client_run_id
        self._run_id = run_id
        self._model = model
        self._after = after
        self._started = False
        self._ended = False
        self._text: str | None = None  # the open text message
        self._reasoning: str | None = None  # the open reasoning message (and its span)
        self._parent: str | None = None  # the assistant message the next tool call belongs to
        self._content_prefix = b""
        self._reasoning_prefix = b""
        self._pending: dict[str, dict[str, Any]] = {}  # confirmations asked, not yet resolved
        self._calls: set[str] = set()  # tool calls started in this window
        self._usage: dict[str, dict[str, int]] = {}

    @property
    def done(self) -> bool:
        return self._ended

    @property
    def paused(self) -> bool:
        return bool(self._pending)

    def opening(self) -> bytes:
        return b""  # RUN_STARTED carries the first event: it goes out with it

    def encode(self, batch: Sequence[WireEvent]) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            first = batch[0]
            raw: dict[str, Any] = (
                first.document
                if first.type == "run.started"
                else {"run_id": self._run_id, "after": self._after}
            )
            out.append(
                _frame(
                    {
                        "type": "RUN_STARTED",
                        "threadId": self._thread_id,
                        "runId": self.client_run_id,
                        "protocolVersion": PROTOCOL_VERSION,
                        "rawEvent": raw,
                    }
                )
            )
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
        self._close_text(out)
        interrupts = []
        for call_id, payload in self._pending.items():
            interrupt: dict[str, Any] = {
                "id": call_id,
                "reason": "confirmation",
                "toolCallId": call_id,
                "responseSchema": RESPONSE_SCHEMA,
                "metadata": {"tool": payload.get("tool"), "arguments": payload.get("arguments")},
            }
            if isinstance(payload.get("question"), str):
                interrupt["message"] = payload["question"]
            if isinstance(payload.get("expires_at"), str):
                interrupt["expiresAt"] = payload["expires_at"]
            interrupts.append(interrupt)
        out.append(self._finished({"outcome": {"type": "interrupt", "interrupts": interrupts}}))
        return b"".join(out)

    # --- translation ----------------------------------------------------------------------

    def _delta(self, event: WireEvent, out: list[bytes]) -> None:
        delta = delta_string(event)
        if delta == b"null":
            return
        self._close_reasoning(out)
        if self._text is None:
            message_id = f"{self._run_id}:m{event.seq}"
            self._text = self._parent = message_id
            out.append(
                _frame({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"})
            )
            self._content_prefix = (
                b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":"'
                + message_id.encode()
                + b'","delta":'
            )
        out.append(self._content_prefix + delta + b"}\n\n")

    def _reasoning_delta(self, event: WireEvent, out: list[bytes]) -> None:
        delta = delta_string(event)
        if delta == b"null":
            return
        if self._reasoning is None:
            self._close_text(out)
            message_id = f"{self._run_id}:reasoning{event.seq}"
            self._reasoning = message_id
            out.append(_frame({"type": "REASONING_START", "messageId": message_id}))
            start = {"type": "REASONING_MESSAGE_START", "messageId": message_id}
            out.append(_frame({**start, "role": "reasoning"}))
            self._reasoning_prefix = (
                b'data: {"type":"REASONING_MESSAGE_CONTENT","messageId":"'
                + message_id.encode()
                + b'","delta":'
            )
        out.append(self._reasoning_prefix + delta + b"}\n\n")

    def _close_reasoning(self, out: list[bytes]) -> None:
        if self._reasoning is not None:
            out.append(_frame({"type": "REASONING_MESSAGE_END", "messageId": self._reasoning}))
            out.append(_frame({"type": "REASONING_END", "messageId": self._reasoning}))
            self._reasoning = None

    def _close_text(self, out: list[bytes]) -> None:
        self._close_reasoning(out)
        if self._text is not None:
            out.append(_frame({"type": "TEXT_MESSAGE_END", "messageId": self._text}))
            self._text = None

    def _event(self, event: WireEvent, out: list[bytes]) -> None:
        kind = event.type
        data = event_data(event)
        if kind == "usage":
            self._count_usage(data)
            return
        if kind == "run.started":
            model = data.get("model")
            self._model = model if isinstance(model, str) else None
            return
        self._close_text(out)
        if kind == "tool.call.started":
            self._tool_call(data, out)
        elif kind == "tool.call.completed":
            self._parent = None  # the next model call answers in a new message
            out.append(self._tool_result(event.seq, data))
        elif kind == "custom":
            self._custom(data, out)
        elif kind == "run.completed":
            output = data.get("output")
            extra: dict[str, Any] = {"outcome": {"type": "success"}}
            if output is not None:
                extra["result"] = output
            out.append(self._finished(extra))
        elif kind == "run.cancelled":
            out.append(self._finished({"outcome": {"type": "cancelled"}}))
        elif kind == "run.failed":
            out.append(self._failed(data))
            self._ended = True
        else:  # run.resumed and any event type added later: passed on as it is
            out.append(_frame({"type": "CUSTOM", "name": kind, "value": data}))

    def _count_usage(self, data: Mapping[str, Any]) -> None:
        model = data.get("model")
        key = model if isinstance(model, str) else self._model or ""
        counts = self._usage.setdefault(key, {"inputTokens": 0, "outputTokens": 0})
        for ours, theirs in _USAGE_NAMES:
            value = data.get(ours)
            if isinstance(value, int):
                counts[theirs] = counts.get(theirs, 0) + value

    def _tool_call(self, data: Mapping[str, Any], out: list[bytes]) -> None:
        call_id = str(data.get("tool_call_id"))
        self._calls.add(call_id)
        start: dict[str, Any] = {
            "type": "TOOL_CALL_START",
            "toolCallId": call_id,
            "toolCallName": str(data.get("name")),
        }
        if self._parent is not None:
            start["parentMessageId"] = self._parent
        out.append(_frame(start))
        out.append(
            _frame(
                {
                    "type": "TOOL_CALL_ARGS",
                    "toolCallId": call_id,
                    "delta": encode_data(data.get("arguments") or {}),
                }
            )
        )
        out.append(_frame({"type": "TOOL_CALL_END", "toolCallId": call_id}))

    def _tool_result(self, seq: int, data: Mapping[str, Any]) -> bytes:
        result: dict[str, Any] = {
            "type": "TOOL_CALL_RESULT",
            "messageId": f"{self._run_id}:r{seq}",
            "toolCallId": str(data.get("tool_call_id")),
            "role": "tool",
        }
        if data.get("is_error"):
            result["content"] = str(data.get("error") or "the tool failed")
            result["metadata"] = {"is_error": True}
        else:
            value = data.get("result")
            result["content"] = value if isinstance(value, str) else encode_data_any(value)
        return _frame(result)

    def _custom(self, data: Mapping[str, Any], out: list[bytes]) -> None:
        name = str(data.get("name"))
        payload = data.get("payload")
        out.append(_frame({"type": "CUSTOM", "name": name, "value": payload}))
        if isinstance(payload, dict) and isinstance(payload.get("tool_call_id"), str):
            if name == "confirmation_requested":
                self._pending[payload["tool_call_id"]] = payload
            elif name == "confirmation_resolved":
                self._pending.pop(payload["tool_call_id"], None)

    def _failed(self, data: Mapping[str, Any]) -> bytes:
        error = data.get("error") or {}
        failed: dict[str, Any] = {
            "type": "RUN_ERROR",
            "message": str(error.get("message") or "the run failed"),
            "code": str(error.get("code") or "internal"),
        }
        usage = self._usage_list()
        if usage:
            failed["usage"] = usage
        return _frame(failed)

    def _finished(self, extra: dict[str, Any]) -> bytes:
        finished: dict[str, Any] = {
            "type": "RUN_FINISHED",
            "threadId": self._thread_id,
            "runId": self.client_run_id,
            **extra,
        }
        usage = self._usage_list()
        if usage:
            finished["usage"] = usage
        self._ended = True
        self._pending.clear()
        return _frame(finished)

    def _usage_list(self) -> list[dict[str, Any]]:
        entries = []
        for model, counts in self._usage.items():
            entry: dict[str, Any] = {
                **counts,
                "totalTokens": counts["inputTokens"] + counts["outputTokens"],
            }
            if model:
                entry["model"] = model
            entries.append(entry)
        return entries


# our usage fields → AG-UI's TokenUsage; the cache and reasoning counts only where reported
_USAGE_NAMES = (
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
    ("cached_input_tokens", "cachedInputTokens"),
    ("cache_write_tokens", "cacheWriteInputTokens"),
    ("reasoning_tokens", "reasoningTokens"),
)


def encode_data_any(value: Any) -> str:
    """Any JSON value as compact JSON (a tool's structured result as the text AG-UI carries)."""
    return encode_data({"v": value})[5:-1]
