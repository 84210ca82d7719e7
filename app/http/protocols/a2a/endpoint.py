"""The A2A endpoints: the agent cards, and ``/a2a/{agent}`` with both bindings.

- ``GET /.well-known/agent-card.json``: the service's card. Every agent is a skill; its
  ``supportedInterfaces`` list JSON-RPC and HTTP+JSON at ``/a2a/{agent}`` for each agent, the
  ``default`` agent first (a client takes the first it speaks);
- ``GET /a2a/{agent}/.well-known/agent-card.json``: one agent's own card (its interfaces only),
  for a client that is handed the agent's URL;
- ``POST /a2a/{agent}``: JSON-RPC; ``/a2a/{agent}/message:send``, ``/message:stream``,
  ``/tasks``, ``/tasks/{id}``, ``/tasks/{id}:cancel``, ``/tasks/{id}:subscribe``: HTTP+JSON.

The bindings are ``a2a-sdk``'s own dispatchers (parsing, ``A2A-Version`` checks, error codes,
the optional 0.3 compatibility), in front of ``RunTaskHandler``. A guard in front of them
authenticates the caller (the service's Bearer keys), resolves the agent, and refuses a body
that is not UTF-8 in the binding's own shape (the SDK would answer it 500, or with its decoder's
message as an internal error).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import JSONParseError
from a2a.server.request_handlers.response_helpers import agent_card_to_dict, build_error_response
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
)
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import InvalidParamsError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import Receive, Scope, Send

from agent_runtime.content import DOCUMENT_MEDIA_TYPES, IMAGE_MEDIA_TYPES
from app.agents.build import AgentProfile
from app.errors import Unauthorized
from app.http import body_media
from app.http.middleware import body_limit, read_body, replay
from app.http.protocols.a2a.caching import card_response
from app.http.protocols.a2a.handler import RunTaskHandler, TaskCaller
from app.http.protocols.bodies import OFF_LOOP_BYTES
from app.server.services import Services

__all__ = ["A2AEndpoint", "agent_card", "service_card"]

_CALLER = "agent_runtime.a2a.caller"
# text, the data parts that answer a question, and the images and documents a message may carry
INPUT_MODES = [
    "text/plain",
    "application/json",
    *sorted(IMAGE_MEDIA_TYPES),
    *sorted(DOCUMENT_MEDIA_TYPES - {"text/plain"}),
]
_BINDINGS = ("JSONRPC", "HTTP+JSON")
_VERSION = "0.1.0"


def _skill(profile: AgentProfile) -> pb.AgentSkill:
    description = profile.system_prompt or f"The {profile.name} agent of this service."
    return pb.AgentSkill(
        id=profile.name,
        name=profile.name,
        description=description[:500],
        tags=["agent", profile.name],
        input_modes=INPUT_MODES,
        output_modes=["text/plain", "application/json"],
    )


def _card(
    base_url: str, profiles: list[AgentProfile], *, name: str, secured: bool, v03: bool
) -> pb.AgentCard:
    versions = [PROTOCOL_VERSION_1_0, *([PROTOCOL_VERSION_0_3] if v03 else [])]
    interfaces = [
        pb.AgentInterface(
            url=f"{base_url}/a2a/{profile.name}", protocol_binding=binding, protocol_version=v
        )
        for v in versions
        for profile in profiles
        for binding in _BINDINGS
    ]
    card = pb.AgentCard(
        name=name,
        description=(
            profiles[0].system_prompt
            if len(profiles) == 1 and profiles[0].system_prompt
            else "Agents served by agent-server: each skill is an agent at /a2a/{agent}."
        ),
        supported_interfaces=interfaces,
        version=_VERSION,
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=INPUT_MODES,
        default_output_modes=["text/plain", "application/json"],
        skills=[_skill(profile) for profile in profiles],
    )
    if secured:
        card.security_schemes["bearer"].http_auth_security_scheme.CopyFrom(
            pb.HTTPAuthSecurityScheme(
                scheme="Bearer", description="An API key of this server (AGENT_API_KEYS)"
            )
        )
        requirement = card.security_requirements.add()
        requirement.schemes["bearer"].SetInParent()
    return card


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _ordered(profiles: dict[str, AgentProfile]) -> list[AgentProfile]:
    return sorted(profiles.values(), key=lambda p: (p.name != "default", p.name))


def service_card(request: Request, services: Services) -> dict[str, Any]:
    """The service's card, for ``request``'s own base URL."""
    card = _card(
        _base_url(request),
        _ordered(dict(services.agents.profiles)),
        name="agent-server",
        secured=request.app.state.authenticator.enabled,
        v03=services.settings.a2a_v03,
    )
    return agent_card_to_dict(card)


def agent_card(request: Request, services: Services, agent: str) -> dict[str, Any]:
    """One agent's card."""
    profile = services.agents.profiles[agent]
    card = _card(
        _base_url(request),
        [profile],
        name=agent,
        secured=request.app.state.authenticator.enabled,
        v03=services.settings.a2a_v03,
    )
    return agent_card_to_dict(card)


class _CallerContext(DefaultServerCallContextBuilder):
    """The SDK's call context, carrying the caller the guard resolved."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["caller"] = request.scope[_CALLER]
        return context


def _error(
    status: int, grpc_status: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """An error in the shape of A2A's HTTP+JSON binding (``google.rpc.Status``)."""
    return JSONResponse(
        {"error": {"code": status, "status": grpc_status, "message": message}},
        status_code=status,
        headers=headers,
    )


_NOT_UTF8 = "the request body is not UTF-8: JSON text must be"


def _not_utf8(path: str, agent: str) -> Response:
    """A body that is not UTF-8, refused as each binding refuses a body it cannot read:
    JSON-RPC's parse error (-32700, no request id: none could be read), HTTP+JSON's 400."""
    if path.rstrip("/") == f"/{agent}":  # the JSON-RPC endpoint
        return JSONResponse(build_error_response(None, JSONParseError(message=_NOT_UTF8)))
    payload = build_rest_error_payload(InvalidParamsError(_NOT_UTF8))
    return JSONResponse(payload, status_code=400)


async def _agent_card_route(request: Request) -> Response:
    services: Services = request.scope[_CALLER].services
    return card_response(request, agent_card(request, services, request.path_params["agent"]))


def _route_path(scope: Scope) -> str:
    """The request's path below the mount (``/{agent}/...``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _without_slash(scope: Scope) -> Scope:
    """``scope`` for its path without the trailing slash."""
    trimmed = dict(scope)
    trimmed["path"] = scope["path"].rstrip("/")
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        trimmed["raw_path"] = raw.rstrip(b"/")
    return trimmed


class A2AEndpoint:
    """``/a2a``: authenticates, resolves ``/{agent}``, then the SDK's dispatchers."""

    def __init__(self, *, v03: bool = False, shutdown_grace_period: float = 0) -> None:
        handler = RunTaskHandler()
        context = _CallerContext()
        routes: list[BaseRoute] = [
            Route(f"/{{agent}}{AGENT_CARD_WELL_KNOWN_PATH}", _agent_card_route, methods=["GET"]),
            *create_jsonrpc_routes(
                handler,
                rpc_url="/{agent}",
                context_builder=context,
                enable_v0_3_compat=v03,
                shutdown_grace_period=shutdown_grace_period,
            ),
            *create_rest_routes(
                handler,
                context_builder=context,
                enable_v0_3_compat=v03,
                path_prefix="/{agent}",
                shutdown_grace_period=shutdown_grace_period,
            ),
        ]
        self._router = Router(routes=routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._router(scope, receive, send)
            return
        path = _route_path(scope)
        agent = path.lstrip("/").split("/", 1)[0]
        if path == f"/{agent}/":
            # the interface URL with a trailing slash (as A2A's TCK posts JSON-RPC): the same
            scope = _without_slash(scope)
            path = f"/{agent}"
        state = scope["app"].state
        services: Services | None = state.services
        if services is None:
            await _error(503, "UNAVAILABLE", "the server is starting", {"Retry-After": "1"})(
                scope, receive, send
            )
            return
        if agent not in services.agents.profiles:
            names = ", ".join(sorted(services.agents.profiles))
            await _error(404, "NOT_FOUND", f"no agent {agent!r}; configured: {names}")(
                scope, receive, send
            )
            return
        principal = ""
        if not path.endswith(AGENT_CARD_WELL_KNOWN_PATH):  # cards are public
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            try:
                principal = state.authenticator.principal(
                    None if header is None else header.decode("latin-1")
                )
            except Unauthorized as exc:
                challenge = {"WWW-Authenticate": 'Bearer realm="agent-server"'}
                await _error(401, "UNAUTHENTICATED", exc.detail, challenge)(scope, receive, send)
                return
        media: dict[str, str] = {}
        if scope["method"] == "POST":
            # the body limit outside refused what is too large (a run start carries media)
            read = await read_body(receive, body_limit(services.settings, scope["path"]))
            if read is None:
                return  # the client went away
            body = read
            if len(body) > OFF_LOOP_BYTES:
                body, media = await asyncio.to_thread(set_media_aside, body)
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                await _not_utf8(path, agent)(scope, receive, send)
                return
            receive = replay(body, receive)
        # the service's own root (this app is mounted at /a2a): files are named under it
        origin = str(Request(scope).url.replace(path="", query="", fragment="")).rstrip("/")
        scope[_CALLER] = TaskCaller(services, principal, agent, origin, media)
        await self._router(scope, receive, send)


# A2A's bytes fields: a 1.0 Part's raw, a 0.3 FileWithBytes' bytes
_BYTES_KEYS = frozenset({b"raw", b"bytes"})


def set_media_aside(body: bytes) -> tuple[bytes, dict[str, str]]:
    """``body`` with its large base64 strings (bytes fields, data URLs) replaced by short
    placeholders, and what each placeholder stands for (``TaskCaller.media``).

    The SDK parses the body on the event loop, JSON and then protobuf, whose base64 decoding
    of 20 MB of an image takes half a second; it parses the placeholders instead, and the
    handler puts the originals back (``message_parts``), handing the base64 to the intake as
    it came. A bytes field's placeholder is base64 of random bytes (the SDK decodes it); a
    data URL's keeps its header. Random, so that no client can name one.
    """
    originals: dict[str, str] = {}

    def placeholder(_: int, text: str) -> str:
        token = base64.b64encode(secrets.token_bytes(24)).decode("ascii")
        if text[:5].lower() == "data:":
            token = f"{text[: text.find(',', 0, 300) + 1]}{token}"
        originals[token] = text
        return token

    rest, _ = body_media.set_aside(body, placeholder, raw_keys=_BYTES_KEYS)
    return rest, originals
