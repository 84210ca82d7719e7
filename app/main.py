"""The FastAPI application: ``create_app(settings)``, and ``app`` for ``uvicorn app.main:app``.

``uvicorn --factory app.main:create_app`` works too. The module-level ``app`` is built on first
access, from the environment, so importing this module reads no settings.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from app.auth.keys import Authenticator
from app.http.api import agents as agents_api
from app.http.api import (
    capabilities,
    external_events,
    files,
    health,
    runs,
    schedules,
    sessions,
    usage,
)
from app.http.api.docs import DOCS_PATHS, install_docs
from app.http.api.errors import CatchAllMiddleware, install_error_handlers
from app.http.api.openapi import install_openapi
from app.http.api.start_path import RunStartMiddleware
from app.http.hosts import AllowedHosts, HostGuardMiddleware
from app.http.middleware import BodyLimitMiddleware, LoadShedMiddleware
from app.http.protocols import agui, ai_sdk, langgraph
from app.http.protocols import openai as openai_protocol
from app.http.protocols.a2a import install_a2a
from app.http.protocols.loading import DeferredEndpoint
from app.http.security import SecurityHeadersMiddleware
from app.server.http_protocol import EdgeLimits, configure, effective_max_connections
from app.server.lifespan import make_lifespan
from app.settings import Settings
from app.telemetry.logs import configure_logging
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import TraceContextMiddleware, tracing_requested

if TYPE_CHECKING:
    from app.http.protocols.mcp_server import McpEndpoint

__all__ = ["UI_DIR", "create_app"]

UI_DIR = Path(__file__).resolve().parent / "http" / "ui"
VERSION = "0.1.0"


def _mcp_endpoint(module: ModuleType) -> McpEndpoint:
    endpoint: McpEndpoint = module.McpEndpoint()
    return endpoint


def _mcp_transport(endpoint: McpEndpoint) -> AbstractAsyncContextManager[None]:
    return endpoint.running()


def create_app(settings: Settings | None = None, *, configure_logs: bool = True) -> FastAPI:
    """Build the service for ``settings`` (default: from the environment)."""
    settings = settings if settings is not None else Settings()
    if configure_logs and not logging.getLogger("app").handlers:
        configure_logging(settings.log_level, settings.log_format)
    _configure_edge(settings)
    metrics = Metrics()
    service_lifespan = make_lifespan(settings, metrics)
    # the MCP SDK loads on the first request to /mcp (see app.http.protocols.loading)
    mcp = DeferredEndpoint("app.http.protocols.mcp_server", _mcp_endpoint, serve=_mcp_transport)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the MCP transport's task group lives inside the services' lifetime, and ends first
        async with service_lifespan(app), mcp.running():
            yield

    app = FastAPI(
        title="agent-server",
        version=VERSION,
        summary="An agent runtime served over HTTP and Server-Sent Events.",
        lifespan=lifespan,
        docs_url=None,  # served offline by install_docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.services = None
    app.state.authenticator = Authenticator(settings.api_key_map)
    install_error_handlers(app)
    install_openapi(app)
    _install_routes(app, settings, mcp)
    _install_middleware(app, settings)
    return app


def _configure_edge(settings: Settings) -> None:
    """The connection guard's limits, within what the file limit allows."""
    # the Redis pool (and its blocking reader) and PostgreSQL's need descriptors too
    max_connections = effective_max_connections(
        settings.max_connections, reserve=settings.redis_max_connections + 16
    )
    if max_connections < settings.max_connections:
        logging.getLogger("app.http").warning(
            "the file limit (RLIMIT_NOFILE) holds %d client connections, not "
            "AGENT_MAX_CONNECTIONS=%d: raise the limit to allow more",
            max_connections,
            settings.max_connections,
        )
    configure(
        EdgeLimits(
            max_header_bytes=settings.max_header_bytes,
            header_timeout=settings.header_timeout,
            max_connections=max_connections,
        )
    )


def _install_routes(app: FastAPI, settings: Settings, mcp: DeferredEndpoint[McpEndpoint]) -> None:
    """The API, the protocols, the docs and the UI, in matching order."""
    app.include_router(runs.router)
    app.include_router(agents_api.router)
    app.include_router(sessions.router)
    app.include_router(usage.router)
    app.include_router(schedules.router)
    app.include_router(files.router)
    app.include_router(external_events.router)
    app.include_router(health.router)
    app.include_router(openai_protocol.router)
    install_a2a(app, settings)
    app.router.routes.append(Route("/mcp", mcp, methods=["GET", "POST", "DELETE"], name="mcp"))
    app.include_router(agui.router)
    app.include_router(ai_sdk.router)
    app.include_router(langgraph.router)
    app.include_router(capabilities.router)
    if settings.debug_endpoints:
        app.include_router(health.debug_router)
    install_docs(app)
    # the browser UI: "/" is index.html; anything not matched above falls through to it
    app.router.routes.append(_UIMount("/", app=_UIFiles(directory=UI_DIR, html=True), name="ui"))


# the standard protocols' own headers too (A2A's version, MCP's session and version, the
# LangGraph SDKs' key header)
_CORS_ALLOW_HEADERS: Final = (
    "Authorization",
    "Content-Type",
    "Last-Event-ID",
    "Idempotency-Key",
    "A2A-Version",
    "Mcp-Protocol-Version",
    "Mcp-Session-Id",
    "X-Api-Key",
)
# Content-Location: the LangGraph SDKs read a streamed run's id from it
_CORS_EXPOSE_HEADERS: Final = (
    "X-Run-Id",
    "Idempotent-Replayed",
    "Retry-After",
    "Location",
    "Content-Location",
    "x-vercel-ai-ui-message-stream",
)


def _install_middleware(app: FastAPI, settings: Settings) -> None:
    """The middleware stack, added innermost first."""
    # CORS wraps everything, so error answers carry its headers too
    app.add_middleware(RunStartMiddleware)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(LoadShedMiddleware)
    origins = settings.cors_origin_list
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=list(_CORS_ALLOW_HEADERS),
            expose_headers=list(_CORS_EXPOSE_HEADERS),
            max_age=600,
        )
    # before anything reads the request: a rebound page's requests run nothing
    app.add_middleware(
        HostGuardMiddleware,
        allowed=AllowedHosts.parse(settings.allowed_host_list, origins),
    )
    # outermost: every answer carries them, errors and CORS preflights included
    app.add_middleware(
        SecurityHeadersMiddleware,
        frame_ancestors=settings.frame_ancestors,
        docs_paths=DOCS_PATHS,
    )
    if tracing_requested():
        # around everything: a run started by the request joins the caller's trace
        app.add_middleware(TraceContextMiddleware)


class _UIFiles(StaticFiles):
    """The UI's files, revalidated on every load so an upgrade reaches browsers at once."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        # ETag and Last-Modified are already set: a revalidation costs a 304, not the file
        response.headers["Cache-Control"] = "no-cache"
        return response


class _UIMount(Mount):
    """The UI's files at "/", for GET and HEAD only.

    A mount at "/" matches every path, which would hide the API's 405s (a known path with
    the wrong method) behind the files' own answers; matching only reads avoids that.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            return Match.NONE, {}
        router = scope.get("router")
        if scope["type"] == "http" and router is not None:
            # a GET of an API path that takes only other methods (POST /external-events) is
            # a 405 from the API, not a missing file
            for route in router.routes:
                if route is not self and route.matches(scope)[0] is Match.PARTIAL:
                    return Match.NONE, {}
        return super().matches(scope)


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # the module-level ``app``, built on first use (uvicorn app.main:app)
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
