"""``/mcp``: the service's agents as MCP tools (Streamable HTTP, the ``mcp`` SDK's server side).

One tool per configured agent, named after it: ``input`` (the message), optional
``session_id`` (continue that session; the result names the session it ran in) and optional
``approve`` (answer the session's pending confirmation). A call is one run, started through
``RunManager.start`` and read from its event log; each text delta goes out as a progress
notification (``message`` = the delta) when the host asked for progress. The model's reasoning
is left out: MCP has no place for it, and a host hands a tool's result to its own model.

A confirmation: on a 2026-07-28 connection whose host declared elicitation, the call returns
``input_required`` with an elicitation asking to approve the held call; the host's retry carries
the answer, which the server delivers, and the call goes on. Any other host gets a result that
says approval is needed and how to give it (call the tool again with ``session_id`` and
``approve``). The server holds the call; no answer can change it.

Stateless mode: no MCP session is kept between requests, so any worker answers any request;
the retry's ``requestState`` names the run and the held call, and both are checked against the
caller's own run before anything is delivered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from app.errors import InvalidRequest, NotAccepted, NotFound, ServiceError, Unauthorized
from app.http.api.schemas import SESSION_ID_PATTERN, is_session_id
from app.http.middleware import read_body, replay
from app.http.protocols.common import (
    answer_confirmation,
    check_session_id,
    check_text,
    follow,
    new_session_id,
    snapshot,
)
from app.http.protocols.mcp_cancel import CancelledCalls, cancelled_request_id
from app.runs import RunRequestOptions
from app.server.services import Services

__all__ = ["McpEndpoint"]

logger = logging.getLogger("app.http.protocols.mcp")

_CALLER = "agent_runtime.mcp.caller"
_WAITING_EVENT = "confirmation_requested"
_ELICITATION_KEY = "confirm"
_INVALID_PARAMS = -32602
_INTERNAL_ERROR = -32603

_Answer = types.CallToolResult | types.InputRequiredResult
_VERSION = "0.1.0"  # the service's (serverInfo.version)


def _input_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "input": {"type": "string", "description": "The message for the agent"},
            "session_id": {
                "type": "string",
                "pattern": SESSION_ID_PATTERN,
                "description": "Continue this session (the result names the session it ran in)",
            },
            "approve": {
                "type": "boolean",
                "description": "Answer the session's pending confirmation (with session_id)",
            },
        },
    }


def _tool(name: str, description: str | None) -> types.Tool:
    return types.Tool(
        name=name,
        description=description or f"Ask the {name} agent. Its own tools run on the server.",
        input_schema=_input_schema(),
    )


class _Caller:
    __slots__ = ("address", "principal", "services")

    def __init__(self, services: Services, principal: str, address: str) -> None:
        self.services = services
        self.principal = principal
        self.address = address  # the host's, which with the principal tells hosts apart


def _caller(ctx: ServerRequestContext[Any, Any]) -> _Caller:
    request = ctx.request
    scope = getattr(request, "scope", None)
    caller = scope.get(_CALLER) if isinstance(scope, dict) else None
    if not isinstance(caller, _Caller):  # pragma: no cover - the guard always sets it
        raise MCPError(code=-32603, message="the request reached the MCP server without a caller")
    return caller


def _error(exc: ServiceError) -> MCPError:
    return MCPError(code=_INVALID_PARAMS, message=exc.detail, data={"code": exc.code})


def _result(text: str, structured: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=structured, is_error=error
    )


def _supports_elicitation(ctx: ServerRequestContext[Any, Any]) -> bool:
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False  # stateless: a handshake-era server cannot send the host a request
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


class _Call:
    """One tool call following its run's log from a cursor to the end or to a question."""

    def __init__(
        self, ctx: ServerRequestContext[Any, Any], caller: _Caller, agent: str, session_id: str
    ) -> None:
        self.ctx = ctx
        self.caller = caller
        self.agent = agent
        self.session_id = session_id
        self.progress = 0

    async def read(self, run_id: str, after: int) -> _Answer:
        text: list[str] = []
        stream = follow(self.caller.services.bus.events, run_id, after)
        try:
            async for document in stream:
                type_ = document["type"]
                data: Mapping[str, Any] = document.get("data") or {}
                if type_ == "text.delta":
                    delta = str(data.get("delta") or "")
                    text.append(delta)
                    self.progress += 1
                    await self.ctx.session.report_progress(self.progress, None, delta)
                elif type_ == "custom" and data.get("name") == _WAITING_EVENT:
                    return self._question(run_id, int(document["seq"]), data.get("payload") or {})
                elif type_ == "run.completed":
                    output = data.get("output") or {}
                    answer = str(output.get("content") or "".join(text))
                    return _result(answer, self._ids(run_id, "completed"))
                elif type_ == "run.failed":
                    error = data.get("error") or {}
                    message = f"{error.get('code')}: {error.get('message')}"
                    structured = {**self._ids(run_id, "failed"), "error": error}
                    return _result(message, structured, error=True)
                elif type_ == "run.cancelled":
                    reason = str(data.get("reason") or "cancel_requested")
                    structured = {**self._ids(run_id, "cancelled"), "reason": reason}
                    return _result(f"The run was cancelled ({reason}).", structured, error=True)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return _result("".join(text), self._ids(run_id, "unknown"), error=True)

    def _ids(self, run_id: str, status: str) -> dict[str, Any]:
        return {"session_id": self.session_id, "run_id": run_id, "status": status}

    def _question(
        self, run_id: str, seq: int, payload: Mapping[str, Any]
    ) -> types.CallToolResult | types.InputRequiredResult:
        call_id = str(payload.get("tool_call_id") or "")
        tool = str(payload.get("tool") or "")
        arguments = payload.get("arguments") or {}
        question = str(payload.get("question") or f"Allow the tool {tool!r} to run?")
        if _supports_elicitation(self.ctx):
            state = json.dumps(
                {"run_id": run_id, "session_id": self.session_id, "call": call_id, "seq": seq}
            )
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=f"{question} ({tool} {json.dumps(arguments)})",
                    requested_schema={
                        "type": "object",
                        "properties": {
                            "approved": {
                                "type": "boolean",
                                "title": "Approve",
                                "description": f"Let the agent run {tool}",
                            }
                        },
                        "required": ["approved"],
                    },
                )
            )
            return types.InputRequiredResult(
                input_requests={_ELICITATION_KEY: request}, request_state=state
            )
        structured = {
            **self._ids(run_id, "approval_required"),
            "tool_call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "question": question,
            "expires_at": payload.get("expires_at"),
        }
        text = (
            f"Approval needed: {question} The agent wants to run {tool} with "
            f"{json.dumps(arguments)}. To answer, call the {self.agent} tool again with "
            f'session_id "{self.session_id}" and approve true or false.'
        )
        return _result(text, structured)

    async def answer(self, run_id: str, call_id: str, approved: bool) -> None:
        caller = self.caller
        if not await answer_confirmation(
            caller.services, caller.principal, self.session_id, run_id, call_id, approved
        ):
            raise NotAccepted(
                "the confirmation is no longer open: it expired, or it was answered already"
            )


async def _pending(services: Services, run_id: str) -> tuple[str, int] | None:
    """The run's open question (its tool call id and seq), if it is waiting for one."""
    documents = await snapshot(services.bus.events, run_id)
    if not documents:
        return None
    open_call: tuple[str, int] | None = None
    for document in documents:
        data = document.get("data") or {}
        if document["type"] == "custom" and data.get("name") == _WAITING_EVENT:
            open_call = (str((data.get("payload") or {}).get("tool_call_id")), int(document["seq"]))
        elif document["type"] == "custom" and data.get("name") == "confirmation_resolved":
            open_call = None
        elif document["type"] in ("run.completed", "run.failed", "run.cancelled"):
            return None
    return open_call


async def _call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    caller = _caller(ctx)
    services = caller.services
    agent = params.name
    if agent not in services.agents.profiles:
        raise MCPError(code=_INVALID_PARAMS, message=f"no tool {agent!r}: the tools are the agents")
    arguments = dict(params.arguments or {})
    try:
        if params.request_state is not None:
            return await _retry(ctx, caller, agent, params)
        # the native run start's rules, before anything is looked up or stored
        check_text("arguments", arguments)
        session_id = arguments.get("session_id")
        if session_id == "":
            session_id = None  # an optional argument a host's form left empty: a new session
        if session_id is not None:
            if not isinstance(session_id, str):
                raise InvalidRequest("session_id must be a string")
            check_session_id("session_id", session_id)
        approve = arguments.get("approve")
        if approve is not None:
            if not isinstance(approve, bool) or session_id is None:
                raise InvalidRequest("approve needs a boolean and the session_id it answers")
            return await _approve(ctx, caller, agent, session_id, approve)
        text = arguments.get("input")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("input: the message for the agent (a non-empty string)")
        # a call naming no session is stateless: its session is not listed, and is kept for
        # AGENT_STATELESS_RETENTION after its last use (app.runs.stateless)
        stateless = session_id is None
        session_id = session_id or new_session_id("mcp")
        handle = await services.manager.start(
            caller.principal,
            session_id,
            RunRequestOptions(
                input=text, agent=agent, on_disconnect="continue", stateless=stateless
            ),
        )
        call = _Call(ctx, caller, agent, session_id)
        # a handshake-era host cancels with notifications/cancelled naming this request
        legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and ctx.request_id is not None
        calls = CancelledCalls(services)
        if legacy:
            await calls.record(caller.principal, caller.address, ctx.request_id, handle.run_id)
        try:
            return await call.read(handle.run_id, 0)
        except BaseException:
            # the host gave up on the call (cancelled it, or went away): so does the run
            services.manager.cancel_local(handle.run_id, "client_disconnected")
            raise
        finally:
            if legacy:
                # shielded: a cancelled call's scope would cancel this await too, and its record
                # would then outlive it and spoil the next call that reuses the request id
                with anyio.CancelScope(shield=True):
                    await calls.forget(
                        caller.principal, caller.address, ctx.request_id, handle.run_id
                    )
    except ServiceError as exc:
        raise _error(exc) from None
    except MCPError:
        raise
    except Exception:
        # the SDK would answer with the error's own text (a database's message, say)
        logger.exception("unhandled error in a call of the MCP tool %s", agent)
        raise MCPError(
            code=_INTERNAL_ERROR, message="the server failed to answer this call; it was logged"
        ) from None


async def _retry(
    ctx: ServerRequestContext[Any, Any],
    caller: _Caller,
    agent: str,
    params: types.CallToolRequestParams,
) -> types.CallToolResult | types.InputRequiredResult:
    """The host's retry after an elicitation: deliver its answer, then read on."""
    try:
        state = json.loads(params.request_state or "")
        run_id, session_id = str(state["run_id"]), str(state["session_id"])
        call_id, seq = str(state["call"]), int(state["seq"])
    except (ValueError, KeyError, TypeError):
        raise InvalidRequest("requestState is not one this server made") from None
    if not (is_session_id(run_id) and is_session_id(session_id)):
        raise InvalidRequest("requestState is not one this server made")
    found = await caller.services.manager.find(run_id, caller.principal, session_id)
    if found is None:
        raise NotFound(f"no run {run_id!r}")
    responses = params.input_responses or {}
    response = responses.get(_ELICITATION_KEY)
    approved = (
        isinstance(response, types.ElicitResult)
        and response.action == "accept"
        and bool((response.content or {}).get("approved"))
    )
    call = _Call(ctx, caller, agent, session_id)
    await call.answer(run_id, call_id, approved)
    return await call.read(run_id, seq)


async def _approve(
    ctx: ServerRequestContext[Any, Any], caller: _Caller, agent: str, session_id: str, approve: bool
) -> types.CallToolResult | types.InputRequiredResult:
    """A host without elicitation answers the session's pending confirmation."""
    services = caller.services
    holder = await services.bus.locks.holder(session_id)
    found = await services.manager.find(holder, caller.principal, session_id) if holder else None
    pending = await _pending(services, found.run_id) if found is not None else None
    if found is None or pending is None:
        raise NotAccepted(f"session {session_id!r} has no confirmation waiting for an answer")
    call_id, seq = pending
    call = _Call(ctx, caller, agent, session_id)
    await call.answer(found.run_id, call_id, approve)
    return await call.read(found.run_id, seq)


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    profiles = _caller(ctx).services.agents.profiles
    return types.ListToolsResult(
        tools=[_tool(name, profiles[name].system_prompt) for name in sorted(profiles)]
    )


_ROUTING_HEADERS = frozenset({b"mcp-name", b"mcp-method"})
_BLANKS = b" \t"


def _routing_headers_stripped(scope: Scope) -> Scope:
    """``scope`` with the blanks around ``Mcp-Name`` / ``Mcp-Method`` removed: the SDK compares
    them with the body's name as they are, and a host that pads them means the same name."""
    headers = scope["headers"]
    if not any(
        name in _ROUTING_HEADERS and value != value.strip(_BLANKS) for name, value in headers
    ):
        return scope
    stripped = [
        (name, value.strip(_BLANKS) if name in _ROUTING_HEADERS else value)
        for name, value in headers
    ]
    return {**scope, "headers": stripped}


class McpEndpoint:
    """The ASGI app of ``/mcp``: Bearer auth, then the SDK's streamable-HTTP transport.

    ``running()`` must wrap the service's lifetime (the transport's task group).
    """

    def __init__(self) -> None:
        self.server: Server[Any] = Server(
            "agent-server", version=_VERSION, on_list_tools=_list_tools, on_call_tool=_call_tool
        )
        self._manager = StreamableHTTPSessionManager(
            app=self.server,
            stateless=True,
            # the service's own auth and CORS guard it; host names are the deployment's
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self._manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope["app"].state
        services: Services | None = state.services
        if services is None:
            response = JSONResponse(
                {"error": "the server is starting"}, status_code=503, headers={"Retry-After": "1"}
            )
            await response(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            principal = state.authenticator.principal(
                None if header is None else header.decode("latin-1")
            )
        except Unauthorized as exc:
            response = JSONResponse(
                {"error": "unauthorized", "error_description": exc.detail},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="agent-server"'},
            )
            await response(scope, receive, send)
            return
        scope = _routing_headers_stripped(scope)
        client = scope.get("client")
        caller = _Caller(services, principal, str(client[0]) if client else "")
        scope[_CALLER] = caller
        if scope["method"] == "POST":
            body = await read_body(receive, services.settings.max_body_bytes)
            if body is None:
                return  # the host went away
            request_id = cancelled_request_id(body)
            if request_id is not None:
                await CancelledCalls(services).cancel(principal, caller.address, request_id)
            receive = replay(body, receive)
        await self._manager.handle_request(scope, receive, send)
