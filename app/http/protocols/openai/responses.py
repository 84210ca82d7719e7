"""``/openai/v1/responses``: the OpenAI Responses API over the service's runs.

A response is a stretch of one run (``response_events``): its id names the run and the seq the
stretch starts after, so any worker answers for it from the run's log, with nothing stored on
the side. ``previous_response_id`` continues that run's session with a new run; an
``mcp_approval_response`` item with ``previous_response_id`` answers the confirmation that
response ended on, and the new response is the same run from there on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.responses import JSONResponse, Response

from app.auth.keys import principal_of
from app.bus.base import LogNotFound
from app.errors import InvalidRequest, NotAccepted, NotFound, ServiceError, UnsupportedMediaType
from app.http.api.streaming import EventStreamResponse
from app.http.protocols.bodies import OffLoopJSONRoute
from app.http.protocols.common import (
    LogResultResponse,
    RefusedValue,
    TranslatingEncoder,
    answer_confirmation,
    cancel_on_disconnect,
    check_fields,
    check_session_id,
    new_session_id,
    snapshot,
)
from app.http.protocols.media import NativePart, has_media, parts_text, run_input, text_part
from app.http.protocols.openai.parameters import (
    refuse_unhonoured_responses,
    responses_text_format,
    sampling_echo,
)
from app.http.protocols.openai.parts import responses_content
from app.http.protocols.openai.response_events import (
    ResponseBuilder,
    format_response_id,
    parse_response_id,
    tool_call_of_approval,
)
from app.http.protocols.openai.schemas import (
    ApprovalAnswer,
    ResponsesRequest,
    invalid_value,
    message_text,
    refuse_client_tools,
)
from app.runs import RunHandle, RunRequestOptions
from app.server.services import Services, ServicesDep
from app.storage import RunRecord

__all__ = ["router"]

# not in /openapi.json: the OpenAI API reference describes these paths
router = APIRouter(tags=["openai"], include_in_schema=False, route_class=OffLoopJSONRoute)

Principal = Annotated[str, Depends(principal_of)]

_WAITING_EVENT = "confirmation_requested"
# how long a cancel waits for the run's end, to answer with the cancelled response
_CANCEL_WAIT = 10.0


def _parse_input(
    body: ResponsesRequest,
) -> tuple[list[NativePart] | None, str | None, list[ApprovalAnswer]]:
    """``(parts, instructions, approvals)`` of the request's input: the last user message's
    parts (text, images, files), the instructions, the approval answers."""
    if isinstance(body.input, str):
        return [text_part(body.input)], body.instructions, []
    parts: list[NativePart] | None = None
    instructions = body.instructions
    approvals: list[ApprovalAnswer] = []
    for index, item in enumerate(body.input):
        kind = item.get("type")
        if kind == "mcp_approval_response":
            try:
                approvals.append(ApprovalAnswer.model_validate(item))
            except ValueError:
                raise InvalidRequest(
                    "input: an mcp_approval_response needs approval_request_id and approve"
                ) from None
        elif kind in (None, "message") and "role" in item:
            role = item["role"]
            if role == "user":
                parts = responses_content(item.get("content"), f"input[{index}].content")
            elif role in ("system", "developer") and body.instructions is None:
                instructions = message_text(item.get("content"))
            # earlier assistant turns: the session already holds the conversation
        elif kind == "reasoning":
            pass  # an earlier response's reasoning, sent back with it: the session holds it too
        elif kind == "function_call_output":
            raise InvalidRequest(
                "input: function_call_output is not accepted: the agent's tool calls run on "
                "the server and their results are already in the response"
            )
        else:
            raise InvalidRequest(f"input: items of type {kind!r} are not supported")
    return parts, instructions, approvals


def _conversation(body: ResponsesRequest) -> str | None:
    """The session named by ``conversation``, held to the session-id rule (``RefusedValue``)."""
    value = body.conversation
    if isinstance(value, dict):
        value = value.get("id")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequest("conversation: expected a session id or {'id': ...}")
    return check_session_id("conversation", value)


async def _find(
    services: Services, response_id: str, principal: str
) -> tuple[str, int, RunHandle | RunRecord]:
    parsed = parse_response_id(response_id)
    if parsed is None:
        raise NotFound(f"no response {response_id!r}")
    run_id, after = parsed
    found = await services.manager.find(run_id, principal)
    if found is None or (after and not await _asked_at(services, run_id, after)):
        raise NotFound(f"no response {response_id!r}")
    return run_id, after, found


async def _asked_at(services: Services, run_id: str, seq: int) -> bool:
    """True if the run's event ``seq`` is a confirmation request: the only places a response
    of the run begins after its first (an id naming any other seq was never given out).
    False too once the log is gone: such a response can no longer be told apart."""
    events = services.bus.events
    last = await events.last_seq(run_id)
    if last is None or last < seq:
        return False
    try:
        subscription = await events.subscribe(run_id, seq - 1)
    except LogNotFound:
        return False
    try:
        batch = await subscription.next()
    finally:
        await subscription.aclose()
    if not batch or batch[0].seq != seq or batch[0].type != "custom":
        return False
    return bool(batch[0].document["data"].get("name") == _WAITING_EVENT)


def _created_at(found: RunHandle | RunRecord) -> float:
    return found.created_at.timestamp()


@dataclass(frozen=True)
class _Asked:
    """What a request asked of its response beyond the input."""

    settings: dict[str, Any] = field(default_factory=lambda: sampling_echo(None))
    """The sampling members the response echoes."""
    text_format: dict[str, Any] | None = None
    """``text.format`` as asked (echoed)."""
    response_format: dict[str, Any] | None = None
    """The run's structured output, from ``text.format``."""


def _asked(body: ResponsesRequest) -> _Asked:
    """What ``body`` asks (``RefusedValue`` for what the service cannot honour)."""
    extra = body.model_extra or {}
    refuse_unhonoured_responses(extra)
    response_format = responses_text_format(body.text)
    form = body.text.get("format") if body.text is not None else None
    return _Asked(
        settings=sampling_echo(extra),
        text_format=dict(form) if isinstance(form, dict) and response_format else None,
        response_format=response_format,
    )


def _builder(
    found: RunHandle | RunRecord,
    run_id: str,
    after: int,
    *,
    stream: bool = False,
    starting_after: int | None = None,
    background: bool = False,
    instructions: str | None = None,
    previous_response_id: str | None = None,
    asked: _Asked | None = None,
) -> ResponseBuilder:
    asked = asked or _Asked()
    return ResponseBuilder(
        response_id=format_response_id(run_id, after),
        model=found.agent,
        created_at=_created_at(found),
        session_id=found.session_id,
        settings=asked.settings,
        text_format=asked.text_format,
        background=background,
        metadata=found.metadata,
        instructions=instructions,
        previous_response_id=previous_response_id,
        stream=stream,
        starting_after=starting_after,
    )


def _answer(
    services: Services,
    builder: ResponseBuilder,
    run_id: str,
    after: int,
    *,
    stream: bool,
    on_gone: Any = None,
) -> Response:
    """The response read from the log after ``after``: streamed, or once it ends."""
    headers = {"X-Run-Id": run_id}
    if stream:
        return EventStreamResponse(
            events=services.bus.events,
            run_id=run_id,
            after=after,
            headers=headers,
            ping=services.settings.sse_ping,
            send_timeout=services.settings.send_timeout,
            on_gone=on_gone,
            manager=services.manager,
            encoder=TranslatingEncoder(builder),
        )
    return LogResultResponse(
        events=services.bus.events,
        run_id=run_id,
        after=after,
        translator=builder,
        result=lambda: (200, builder.response()),
        headers=headers,
        on_gone=on_gone,
        manager=services.manager,
    )


@router.post("/openai/v1/responses", summary="Create a response (run an agent)")
async def create_response(
    body: ResponsesRequest, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run of agent ``model`` (or answer a confirmation) and answer as the Responses
    API does: streamed events, the finished response, or at once with ``background``."""
    try:
        check_fields(body)
        session_id = _conversation(body)
        asked = _asked(body)
        parts, instructions, approvals = _parse_input(body)
    except (RefusedValue, UnsupportedMediaType) as exc:  # a bad value or part
        return invalid_value(exc)
    refuse_client_tools(body.tools)
    if approvals:
        if parts is not None:
            raise InvalidRequest(
                "input: send an mcp_approval_response alone, then the next message once the "
                "response it continues is over"
            )
        return await _answer_approvals(body, approvals, principal, services, asked)
    if parts is None or not (has_media(parts) or parts_text(parts, "").strip()):
        raise InvalidRequest("input: expected a string or a user message with content")
    manager = services.manager
    manager.profile(body.model)  # an unknown model is a 404 before anything is created
    if body.previous_response_id is not None:
        if session_id is not None:
            raise InvalidRequest("conversation and previous_response_id cannot be used together")
        _, _, previous = await _find(services, body.previous_response_id, principal)
        session_id = previous.session_id
    # no conversation named (or store: false): a stateless call, whose session is not listed
    # and is kept only for AGENT_STATELESS_RETENTION after its last use (app.runs.stateless)
    stateless = body.store is False or session_id is None
    if session_id is None:
        session_id = new_session_id("conv")
    try:
        taken = await run_input(services, principal, parts, separator="")
    except ServiceError as exc:
        return invalid_value(exc)
    async with taken:
        options = RunRequestOptions(
            input=taken.text,
            parts=taken.parts,
            agent=body.model,
            background=body.background,
            on_disconnect="continue" if body.background else "cancel",
            metadata=body.metadata or {},
            system_prompt=instructions,
            stateless=stateless,
            response_format=asked.response_format,
        )
        handle = await manager.start(principal, session_id, options)
    builder = _builder(
        handle,
        handle.run_id,
        0,
        stream=body.stream,
        background=body.background,
        instructions=instructions,
        previous_response_id=body.previous_response_id,
        asked=asked,
    )
    if body.background and not body.stream:
        return JSONResponse(builder.response(), headers={"X-Run-Id": handle.run_id})
    on_gone = None if body.background else cancel_on_disconnect(manager, handle)
    return _answer(services, builder, handle.run_id, 0, stream=body.stream, on_gone=on_gone)


async def _answer_approvals(
    body: ResponsesRequest,
    approvals: list[ApprovalAnswer],
    principal: str,
    services: Services,
    wanted: _Asked,
) -> Response:
    """Deliver the answers to the run the previous response ended on; the new response is
    that run from the confirmation on."""
    if body.previous_response_id is None:
        raise InvalidRequest(
            "an mcp_approval_response needs previous_response_id: the response that asked"
        )
    run_id, after, found = await _find(services, body.previous_response_id, principal)
    events = await snapshot(services.bus.events, run_id, after)
    if events is None:
        raise NotFound(f"the events of response {body.previous_response_id!r} are no longer kept")
    asked = {
        str((doc["data"].get("payload") or {}).get("tool_call_id")): int(doc["seq"])
        for doc in events
        if doc["type"] == "custom" and doc["data"].get("name") == _WAITING_EVENT
    }
    resume_after = after
    for approval in approvals:
        call_id = tool_call_of_approval(approval.approval_request_id)
        if call_id is None or call_id not in asked:
            raise NotAccepted(
                f"approval_request_id {approval.approval_request_id!r} is not a request of "
                f"response {body.previous_response_id!r}"
            )
        if not await answer_confirmation(
            services, principal, found.session_id, run_id, call_id, approval.approve
        ):
            raise NotAccepted(
                f"the request {approval.approval_request_id!r} is not waiting for an answer: "
                "it was answered already, it expired, or its run ended",
                extra={"accepted_by": []},
            )
        resume_after = max(resume_after, asked[call_id])
    builder = _builder(
        found,
        run_id,
        resume_after,
        stream=body.stream,
        background=body.background,
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        asked=wanted,
    )
    if body.background and not body.stream:
        return JSONResponse(builder.response(), headers={"X-Run-Id": run_id})
    return _answer(services, builder, run_id, resume_after, stream=body.stream)


@router.post("/openai/v1/responses/compact", summary="Compact a conversation (not supported)")
async def compact_response(principal: Principal) -> Response:
    """Not offered: a session's history is compacted by the agent itself, server-side."""
    raise NotFound(
        "POST /openai/v1/responses/compact is not supported: the conversation lives in the "
        "session, which the agent compacts itself; continue it with previous_response_id"
    )


@router.get("/openai/v1/responses/{response_id}", summary="Retrieve a response")
async def retrieve_response(
    response_id: str,
    principal: Principal,
    services: ServicesDep,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=-1)] = None,
) -> Response:
    """The response as it stands; ``stream=true`` replays its events (after
    ``starting_after``) and follows them live to its end."""
    run_id, after, found = await _find(services, response_id, principal)
    if stream:
        if not await services.bus.events.exists(run_id):
            raise NotFound(f"the events of response {response_id!r} are no longer kept")
        builder = _builder(found, run_id, after, stream=True, starting_after=starting_after)
        return _answer(services, builder, run_id, after, stream=True)
    return JSONResponse(await _current(services, found, run_id, after))


async def _current(
    services: Services, found: RunHandle | RunRecord, run_id: str, after: int
) -> dict[str, Any]:
    builder = _builder(found, run_id, after)
    builder.opening()
    events = await snapshot(services.bus.events, run_id, after)
    if events is None:
        return _from_record(builder, found)
    for document in events:
        builder.feed(document)
        if builder.done:
            break
    return builder.response()


def _from_record(builder: ResponseBuilder, found: RunHandle | RunRecord) -> dict[str, Any]:
    """A response whose log expired: what the stored run still tells (its final answer)."""
    response = builder.response()
    status = found.status
    response["status"] = {
        "completed": "completed",
        "failed": "failed",
        "cancelled": "cancelled",
        "queued": "queued",
    }.get(status, "in_progress")
    if found.output and isinstance(found.output.get("content"), str):
        response["output"] = [
            {
                "id": f"msg_{builder.response_id.removeprefix('resp_')}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": found.output["content"], "annotations": []}
                ],
            }
        ]
    if found.error:
        code = str(found.error.get("code") or "internal")
        response["error"] = {
            "code": "server_error",
            "message": f"{code}: {found.error.get('message') or 'the run failed'}",
            "type": code,
        }
    if found.finished_at is not None:
        response["completed_at"] = int(found.finished_at.timestamp())
    return response


@router.post("/openai/v1/responses/{response_id}/cancel", summary="Cancel a response")
async def cancel_response(
    response_id: str, principal: Principal, services: ServicesDep
) -> Response:
    """Cancel the response's run (idempotent); answers the response once the run ended."""
    run_id, after, found = await _find(services, response_id, principal)
    answer = await services.manager.cancel(run_id, principal)
    if answer is None:
        raise NotFound(f"no response {response_id!r}")
    state, _ = answer
    if state == "cancelling":
        await _wait_end(services, run_id)
    found = await services.manager.find(run_id, principal) or found
    return JSONResponse(await _current(services, found, run_id, after))


async def _wait_end(services: Services, run_id: str) -> None:
    """Wait (a bounded time) until the run's log holds its terminal event."""
    events = services.bus.events
    last = await events.last_seq(run_id)
    if last is None:
        return
    try:
        subscription = await events.subscribe(run_id, max(0, last - 1))
    except LogNotFound:
        return
    try:
        async with asyncio.timeout(_CANCEL_WAIT):
            while not subscription.finished:
                await subscription.next()
    except TimeoutError:
        pass
    finally:
        await subscription.aclose()
