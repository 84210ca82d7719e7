"""Runs on a thread (and stateless ones): start, stream, wait, join, list, read, cancel, and
the answer to an interrupt (``command: {"resume": ...}``).

A LangGraph run ends where ours waits for an answer: its stream ends at the interrupt, and a
join answers the thread's values with the interrupt. The answer continues our same run (the
run id stays), as the interrupt's resume continues the graph in LangGraph.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from app.bus.wire import iso_ms
from app.errors import Conflict, InvalidRequest, NotFound, SessionBusy
from app.http.api.streaming import EventStreamResponse
from app.http.protocols.common import (
    SSE_HEADERS,
    active_run,
    answer_confirmation,
    busy_reason,
    disconnect_policy,
    event_document,
    read_log,
    snapshot,
)
from app.http.protocols.langgraph.assistants import assistant_of
from app.http.protocols.langgraph.fold import RunFold
from app.http.protocols.langgraph.keys import Principal
from app.http.protocols.langgraph.messages import input_parts
from app.http.protocols.langgraph.state import read_thread
from app.http.protocols.langgraph.stream import LangGraphEncoder, stream_modes
from app.http.protocols.langgraph.threads import check_thread_id, owned_thread
from app.http.protocols.media import has_media, parts_text, run_input
from app.runs import RunHandle, RunRequestOptions
from app.server.services import Services, ServicesDep
from app.storage import RunRecord, SessionRecord

__all__ = ["router"]

router = APIRouter()

# our status → LangGraph's: a run waiting for an answer has ended, as far as LangGraph is told
_STATUS = {
    "queued": "pending",
    "running": "running",
    "waiting": "success",
    "completed": "success",
    "failed": "error",
    "cancelled": "interrupted",
}


class RunCreate(BaseModel):
    """A run request as ``langgraph-sdk`` sends it (options it does not know are ignored by
    LangGraph too, except those refused below)."""

    model_config = ConfigDict(extra="allow")

    assistant_id: str
    input: dict[str, Any] | None = None
    command: dict[str, Any] | None = None
    stream_mode: str | list[str] = "values"
    stream_resumable: bool = False
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    checkpoint: dict[str, Any] | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    webhook: str | None = None
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] = "reject"
    if_not_exists: Literal["create", "reject"] = "reject"
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: int | None = Field(default=None, ge=0)


def _refuse_unoffered(body: RunCreate) -> None:
    if body.interrupt_before or body.interrupt_after:
        raise InvalidRequest(
            "interrupt_before and interrupt_after are not offered: an agent's tool calls are "
            "interrupted by their policy (ask)"
        )
    if body.after_seconds:
        raise InvalidRequest("after_seconds is not offered: use POST /v1/schedules")


def _run_view(found: RunHandle | RunRecord, status: str, assistant: str) -> dict[str, Any]:
    created = found.created_at
    finished = found.finished_at or created
    return {
        "run_id": found.run_id,
        "thread_id": found.session_id,
        "assistant_id": assistant,
        "created_at": iso_ms(created.timestamp()),
        "updated_at": iso_ms(finished.timestamp()),
        "status": _STATUS.get(status, "pending"),
        "metadata": dict(found.metadata),
        "multitask_strategy": "reject",
        "kwargs": {},
    }


def _status(services: Services, found: RunHandle | RunRecord) -> str:
    if isinstance(found, RunHandle):
        return services.manager.live_status(found)
    return found.status


async def _thread_for(
    services: Services, thread_id: str | None, principal: str, if_not_exists: str
) -> SessionRecord:
    if thread_id is None:  # a stateless run: a thread of its own, not listed, kept a while
        created = await services.store.get_or_create_session(
            f"lg-{uuid.uuid4()}", principal, stateless=True
        )
        return created
    check_thread_id(thread_id)
    try:
        return await owned_thread(services, thread_id, principal)
    except NotFound:
        if if_not_exists != "create":
            raise
    existing = await services.store.get_session(thread_id)
    if existing is not None:  # another's: as if it did not exist, and not creatable
        raise NotFound(f"thread {thread_id!r} not found")
    return await services.store.get_or_create_session(thread_id, principal)


@dataclass(frozen=True, slots=True)
class _Answer:
    """One ``HumanResponse`` as our answer: approved or not, and an edit's arguments."""

    call_id: str
    approved: bool
    arguments: dict[str, Any] | None = None
    reply: str | None = None


def _edit(call_id: str, args: Any, asked: Mapping[str, Any]) -> _Answer:
    """An ``edit`` (its ``args`` an ``ActionRequest``: ``{"action", "args"}``) of the call
    ``asked`` (the confirmation's payload), where the call's tool allows edits."""
    tool = asked.get("tool")
    if asked.get("editable") is not True:
        raise InvalidRequest(
            f"an 'edit' answer is not offered for interrupt {call_id!r}: its config does not "
            f"allow edits (the tool {tool!r} runs with the arguments it was called with)",
            code="answer_not_allowed",
        )
    if not isinstance(args, Mapping) or not isinstance(args.get("args"), Mapping):
        raise InvalidRequest(
            "an 'edit' HumanResponse carries an ActionRequest: "
            '{"type": "edit", "args": {"action": <tool>, "args": {...}}}'
        )
    if args.get("action", tool) != tool:
        raise InvalidRequest(
            f"an edit cannot change the tool: interrupt {call_id!r} is for {tool!r}",
            code="answer_not_allowed",
        )
    return _Answer(call_id, True, dict(args["args"]))


def _human_answers(resume: Any, pending: Mapping[str, Mapping[str, Any]]) -> list[_Answer]:
    """``command.resume`` as answers to the pending interrupts (their confirmation payloads,
    by tool call id, in the order asked).

    A ``HumanResponse`` (``{"type": "accept"|"ignore"|"response"|"edit", "args"}``), a list
    of them (one per pending interrupt, in order), or a mapping of interrupt id to one.
    """
    if isinstance(resume, Mapping) and "type" not in resume:
        items = [(str(k), v) for k, v in resume.items()]
    else:
        responses = resume if isinstance(resume, list) else [resume]
        if len(responses) > len(pending):
            raise InvalidRequest(
                f"command.resume has {len(responses)} answers for {len(pending)} interrupt(s)"
            )
        items = list(zip(pending, responses, strict=False))
    answers: list[_Answer] = []
    for call_id, response in items:
        if call_id not in pending:
            raise NotFound(f"no interrupt {call_id!r} is waiting on this thread")
        kind = response.get("type") if isinstance(response, Mapping) else response
        if kind in ("accept", True):
            answers.append(_Answer(call_id, True))
        elif kind in ("ignore", False):
            answers.append(_Answer(call_id, False))
        elif kind == "edit":
            args = response.get("args") if isinstance(response, Mapping) else None
            answers.append(_edit(call_id, args, pending[call_id]))
        elif kind == "response":
            # the call does not run: the model gets the person's reply in the tool's place
            reply = response.get("args") if isinstance(response, Mapping) else None
            if not isinstance(reply, str):
                raise InvalidRequest(
                    'a \'response\' HumanResponse carries its text: {"type": "response", '
                    '"args": "..."}',
                    code="invalid_response",
                )
            answers.append(_Answer(call_id, False, reply=reply))
        else:
            raise InvalidRequest(
                "command.resume must be a HumanResponse ({type: accept|ignore|response|edit}), "
                "a list of them, or a mapping of interrupt id to one"
            )
    return answers


async def _answer(
    services: Services, principal: str, session: SessionRecord, resume: Any
) -> tuple[str, int]:
    """Answer the thread's waiting run; its id and the seq to stream the rest from."""
    run_id = await active_run(services, session.id, principal)
    if run_id is None:
        raise Conflict(f"thread {session.id!r} has no interrupt waiting", code="not_accepted")
    logged = await read_log(services, run_id)
    pending = {c.tool_call_id: c.payload for c in logged.pending()}
    if not pending:
        raise Conflict(f"thread {session.id!r} has no interrupt waiting", code="not_accepted")
    answers = _human_answers(resume, pending)
    after = min(logged.confirmations[answer.call_id].seq for answer in answers)
    for answer in answers:
        if not await answer_confirmation(
            services,
            principal,
            session.id,
            run_id,
            answer.call_id,
            answer.approved,
            answer.arguments,
            reply=answer.reply,
        ):
            raise Conflict(f"interrupt {answer.call_id!r} was not accepted", code="not_accepted")
    return run_id, after


async def _fold(
    services: Services, session: SessionRecord, run_id: str, prompt: str, after: int
) -> RunFold:
    """A fold of the run's log up to ``after`` (what a stream from ``after`` starts on)."""
    view = await read_thread(services, session)
    found = services.manager.local(run_id)
    branch = found.options.branch_from if found is not None else None
    fold = RunFold(run_id, session.id, view.stored_messages(branch), prompt)
    if after > 0:
        for document in await snapshot(services.bus.events, run_id) or []:
            if int(document.get("seq") or 0) > after:
                break
            fold.feed(document)
        # answered: what follows says whether they resolved
        fold.interrupts.clear()
        fold.interrupt_seqs.clear()
    return fold


def _stream_headers(request: Request, thread_id: str, run_id: str) -> dict[str, str]:
    base = str(request.base_url).rstrip("/")
    run = f"/langgraph/threads/{thread_id}/runs/{run_id}"
    return {
        **SSE_HEADERS,
        "Content-Location": run,
        "Location": f"{base}{run}/stream",
        "X-Run-Id": run_id,
    }


async def _start(
    services: Services, principal: str, session: SessionRecord, body: RunCreate
) -> tuple[str, int, str]:
    """Start the run (or answer the waiting one); its id, the seq to read from, its prompt."""
    _refuse_unoffered(body)
    agent = assistant_of(services, body.assistant_id)
    checkpoint = body.checkpoint_id or (body.checkpoint or {}).get("checkpoint_id")
    branch_from: str | None = None
    if checkpoint:
        view = await read_thread(services, session)
        branch_from = view.checkpoint_run(str(checkpoint))
        if branch_from is None:
            raise NotFound(f"checkpoint {checkpoint!r} not found in thread {session.id!r}")
        if body.command is not None:
            raise InvalidRequest("command and checkpoint_id cannot be combined")
        if branch_from == view.turns[-1][0]:
            branch_from = None  # the latest turn: no fork, the thread goes on
    if body.command is not None:
        if "resume" not in body.command:
            raise InvalidRequest("command: only resume is offered")
        run_id, after = await _answer(services, principal, session, body.command["resume"])
        found = await services.manager.find(run_id, principal, session.id)
        return run_id, after, found.input if found is not None else ""
    parts = input_parts(body.input)
    if parts is None or not (has_media(parts) or parts_text(parts, "").strip()):
        raise InvalidRequest("input must hold a human message with content: {messages: [...]}")
    on_disconnect = body.on_disconnect or ("continue" if body.stream_resumable else "cancel")
    taken = await run_input(services, principal, parts, separator="")
    try:
        async with taken:
            options = RunRequestOptions(
                input=taken.text,
                parts=taken.parts,
                agent=agent,
                on_disconnect=on_disconnect,
                metadata={**(body.metadata or {}), "langgraph": {"assistant_id": agent}},
                multitask_strategy=body.multitask_strategy,
                webhook_url=body.webhook,
                branch_from=branch_from,
            )
            handle = await services.manager.submit(principal, session.id, options)
    except SessionBusy as exc:
        if await busy_reason(services, exc, principal) == "interrupt_pending":
            raise SessionBusy(
                f"thread {session.id!r} has an interrupt waiting: answer it with "
                "command.resume before starting a run",
                extra=exc.extra,
                code="interrupt_pending",
            ) from None
        raise
    return handle.run_id, 0, taken.text


async def _stream(
    request: Request,
    services: Services,
    session: SessionRecord,
    run_id: str,
    prompt: str,
    modes: frozenset[str],
    after: int,
    on_disconnect: str,
) -> Response:
    fold = await _fold(services, session, run_id, prompt, after)
    return EventStreamResponse(
        events=services.bus.events,
        run_id=run_id,
        after=after,
        headers=_stream_headers(request, session.id, run_id),
        ping=services.settings.sse_ping,
        send_timeout=services.settings.send_timeout,
        on_gone=disconnect_policy(services, run_id, on_disconnect),
        manager=services.manager,
        encoder=LangGraphEncoder(fold, modes),
    )


def _modes(body: RunCreate) -> frozenset[str]:
    try:
        return stream_modes(body.stream_mode)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


@router.post("/threads/{thread_id}/runs/stream")
async def stream(
    thread_id: str, body: RunCreate, request: Request, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run (or answer an interrupt) and stream it."""
    modes = _modes(body)
    session = await _thread_for(services, thread_id, principal, body.if_not_exists)
    run_id, after, prompt = await _start(services, principal, session, body)
    policy = body.on_disconnect or ("continue" if body.stream_resumable else "cancel")
    return await _stream(request, services, session, run_id, prompt, modes, after, policy)


@router.post("/runs/stream")
async def stream_stateless(
    body: RunCreate, request: Request, principal: Principal, services: ServicesDep
) -> Response:
    """A run on a thread of its own, streamed."""
    modes = _modes(body)
    session = await _thread_for(services, None, principal, "create")
    run_id, after, prompt = await _start(services, principal, session, body)
    policy = body.on_disconnect or "cancel"
    return await _stream(request, services, session, run_id, prompt, modes, after, policy)


async def _until_settled(services: Services, run_id: str, after: int = 0) -> None:
    """Return once the run has ended or waits for an answer asked after ``after``."""
    subscription = await services.bus.events.subscribe(run_id, 0)
    fold = RunFold(run_id, "", [], "")
    try:
        while not subscription.finished:
            for event in await subscription.next():
                fold.feed(event_document(event))
            if fold.ended or fold.waits_since(after):
                return
    finally:
        await subscription.aclose()


async def _values_after(
    services: Services, principal: str, session: SessionRecord, run_id: str, after: int = 0
) -> Response:
    await _until_settled(services, run_id, after)
    view = await read_thread(services, await owned_thread(services, session.id, principal))
    values = view.values()
    interrupts = view.interrupts()
    if interrupts:
        values = {**values, "__interrupt__": interrupts}
    found = await services.manager.find(run_id, principal, session.id)
    if isinstance(found, RunRecord) and found.status == "failed":
        error = found.error or {}
        return JSONResponse(
            {"__error__": {"error": error.get("code"), "message": error.get("message")}},
            headers={"Content-Location": f"/langgraph/threads/{session.id}/runs/{run_id}"},
        )
    return JSONResponse(
        values, headers={"Content-Location": f"/langgraph/threads/{session.id}/runs/{run_id}"}
    )


@router.post("/threads/{thread_id}/runs/wait")
async def wait(
    thread_id: str, body: RunCreate, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run (or answer an interrupt) and answer the thread's values once it settles."""
    session = await _thread_for(services, thread_id, principal, body.if_not_exists)
    run_id, after, _ = await _start(services, principal, session, body)
    return await _values_after(services, principal, session, run_id, after)


@router.post("/runs/wait")
async def wait_stateless(body: RunCreate, principal: Principal, services: ServicesDep) -> Response:
    """A run on a thread of its own; its values once it settles."""
    session = await _thread_for(services, None, principal, "create")
    run_id, _, _ = await _start(services, principal, session, body)
    return await _values_after(services, principal, session, run_id)


@router.post("/threads/{thread_id}/runs")
async def create(
    thread_id: str, body: RunCreate, principal: Principal, services: ServicesDep
) -> Response:
    """Start a run in the background; the run object."""
    session = await _thread_for(services, thread_id, principal, body.if_not_exists)
    body.on_disconnect = "continue"
    run_id, _, _ = await _start(services, principal, session, body)
    return JSONResponse(await _view(services, principal, session.id, run_id, body.assistant_id))


async def _view(
    services: Services, principal: str, thread_id: str, run_id: str, assistant: str | None = None
) -> dict[str, Any]:
    found = await services.manager.find(run_id, principal, thread_id)
    if found is None:
        queued = await services.manager.queued_view(run_id, principal)
        if queued is None or queued.get("session_id") != thread_id:
            raise NotFound(f"run {run_id!r} not found")
        created = str(queued.get("created_at") or "")
        return {
            "run_id": run_id,
            "thread_id": thread_id,
            "assistant_id": assistant or str(queued.get("agent") or ""),
            "created_at": created,
            "updated_at": created,
            "status": "pending",
            "metadata": queued.get("metadata") or {},
            "multitask_strategy": "enqueue",
            "kwargs": {},
        }
    return _run_view(found, _status(services, found), assistant or found.agent)


@router.get("/threads/{thread_id}/runs")
async def list_runs(
    thread_id: str,
    principal: Principal,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """The thread's runs, newest first."""
    await owned_thread(services, thread_id, principal)
    records = await services.store.list_runs(thread_id, limit + offset)
    views = [_run_view(r, r.status, r.agent) for r in records[offset:]]
    for view in views:  # a run held here knows better than its record
        found = services.manager.local(view["run_id"])
        if found is not None:
            view["status"] = _STATUS.get(services.manager.live_status(found), "pending")
    return JSONResponse(views)


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get(thread_id: str, run_id: str, principal: Principal, services: ServicesDep) -> Response:
    """One run of the thread."""
    await owned_thread(services, thread_id, principal)
    return JSONResponse(await _view(services, principal, thread_id, run_id))


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join(
    thread_id: str, run_id: str, principal: Principal, services: ServicesDep
) -> Response:
    """The thread's values once the run has ended or waits for an answer."""
    session = await owned_thread(services, thread_id, principal)
    if await services.manager.find(run_id, principal, thread_id) is None:
        raise NotFound(f"run {run_id!r} not found")
    return await _values_after(services, principal, session, run_id)


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(
    thread_id: str,
    run_id: str,
    request: Request,
    principal: Principal,
    services: ServicesDep,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """The run's stream, from its start or after ``Last-Event-ID``; on any worker."""
    session = await owned_thread(services, thread_id, principal)
    found = await services.manager.find(run_id, principal, thread_id)
    if found is None:
        raise NotFound(f"run {run_id!r} not found")
    try:
        modes = stream_modes([m for m in stream_mode or [] if m] or ["values"])
        after = int(last_event_id) if last_event_id else 0
    except ValueError as exc:
        raise InvalidRequest(f"bad stream_mode or Last-Event-ID: {exc}") from None
    if after < 0:
        raise InvalidRequest("Last-Event-ID must be a non-negative integer")
    return await _stream(request, services, session, run_id, found.input, modes, after, "continue")


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel(
    thread_id: str,
    run_id: str,
    principal: Principal,
    services: ServicesDep,
    wait: Annotated[bool, Query()] = False,
    action: Annotated[Literal["interrupt", "rollback"], Query()] = "interrupt",
) -> Response:
    """Cancel the run (``rollback`` is refused: a stopped turn is kept)."""
    await owned_thread(services, thread_id, principal)
    if action == "rollback":
        raise InvalidRequest("action=rollback is not offered: a cancelled run keeps its turn")
    if await services.manager.find(run_id, principal, thread_id) is None:
        raise NotFound(f"run {run_id!r} not found")
    await services.manager.cancel(run_id, principal)
    if wait:
        await _until_settled(services, run_id)
        return Response(status_code=204)
    return Response(status_code=202)


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
async def delete_run(
    thread_id: str, run_id: str, principal: Principal, services: ServicesDep
) -> Response:
    """Runs are kept with their thread: deleting one alone is not offered."""
    await owned_thread(services, thread_id, principal)
    raise InvalidRequest("deleting a single run is not offered: delete its thread")
