"""The DNS-rebinding guard: only the host names the service is reached by, only their origins.

A page on ``evil.example.com`` whose name is made to resolve to 127.0.0.1 (DNS rebinding) can
send requests to a server on loopback as if it were the same site: its ``Origin`` and the
request's ``Host`` are ``evil.example.com``. Without keys (the default) such a request would run
the agent and its tools. ``AGENT_ALLOWED_HOSTS`` names the host names the service answers to
(loopback names by default); every request whose ``Host`` is not one of them, or whose
``Origin`` (a browser's) is neither one of them nor an ``AGENT_CORS_ORIGINS`` origin, is 403
``forbidden_host``, in the shape of the path's protocol, before anything is read.

Entries: a host name or address (``agents.example.com``, ``10.0.0.5``, ``::1``; any port),
``*.example.com`` (its subdomains), or ``*`` (any host, any origin: behind a reverse proxy that
checks them itself). The health and metrics probes are not guarded: orchestrators and scrapers
address each worker by its IP, and they answer nothing a page could use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.api.errors import problem_response

__all__ = ["LOOPBACK_NAMES", "AllowedHosts", "HostGuardMiddleware", "host_name"]

logger = logging.getLogger("app.http.hosts")

LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1")
"""``AGENT_ALLOWED_HOSTS``'s default: the names of this machine's loopback interface."""

CODE: Final = "forbidden_host"
# probes address each worker by its own address (a pod's IP); they carry nothing a page can use
_UNGUARDED: Final = frozenset({"/healthz", "/readyz", "/metrics"})


def host_name(value: str) -> str | None:
    """The host name of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``),
    lower-cased, without brackets or port; None if it is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        return value[1:end] or None
    name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name.rstrip(".")


@dataclass(frozen=True)
class AllowedHosts:
    """The host names (and origins) the service answers to."""

    names: frozenset[str]
    suffixes: tuple[str, ...]
    origins: frozenset[str]
    any: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str], cors_origins: Iterable[str] = ()) -> AllowedHosts:
        """From ``AGENT_ALLOWED_HOSTS``'s entries and ``AGENT_CORS_ORIGINS``' origins."""
        names: set[str] = set()
        suffixes: list[str] = []
        any_host = False
        for entry in entries:
            entry = entry.strip().lower()
            if entry == "*":
                any_host = True
            elif entry.startswith("*."):
                suffixes.append(entry[1:])
            elif entry:
                names.add(entry.removeprefix("[").removesuffix("]"))
        origins = frozenset(origin.strip().rstrip("/").lower() for origin in cors_origins)
        return cls(frozenset(names), tuple(suffixes), origins, any_host or "*" in origins)

    def allows_name(self, name: str) -> bool:
        """True if requests may name ``name`` (a bare host name) as their host."""
        return self.any or name in self.names or name.endswith(self.suffixes)

    def allows_host(self, header: str) -> bool:
        """True for a ``Host`` header value of an allowed name."""
        name = host_name(header)
        return name is not None and self.allows_name(name)

    def allows_origin(self, header: str) -> bool:
        """True for an ``Origin`` on an allowed host name, or one of the CORS origins.

        ``null`` (a sandboxed frame, a file) is a page of no site: refused unless ``*``.
        """
        origin = header.strip().lower()
        if self.any or origin in self.origins:
            return True
        try:
            parts = urlsplit(origin)
            name = parts.hostname
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not name:
            return False
        return self.allows_name(name.rstrip("."))


def _refusal(path: str, detail: str) -> Response:
    """403 in the shape of the path's protocol (each client reads its own)."""
    if path == "/mcp" or path.startswith("/mcp/"):
        # JSON-RPC's error without an id, as the MCP transport says to refuse an Origin
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": detail}}
        return JSONResponse(body, status_code=403)
    if path.startswith("/a2a/") or path == "/.well-known/agent-card.json":
        # A2A's HTTP+JSON error (google.rpc.Status), as the A2A guard answers
        body = {"error": {"code": 403, "status": "PERMISSION_DENIED", "message": detail}}
        return JSONResponse(body, status_code=403)
    # problem+json; under /openai/ the OpenAI error shape
    return problem_response(403, CODE, detail, path=path)


class HostGuardMiddleware:
    """403 ``forbidden_host`` for a ``Host`` or ``Origin`` that ``allowed`` does not allow.

    A request without ``Host`` (HTTP/1.0, a raw ASGI call) names no host a page could have
    rebound; one without ``Origin`` was not sent by a page of another site.
    """

    def __init__(self, app: ASGIApp, *, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        allowed = self.allowed
        if scope["type"] != "http" or allowed.any or scope["path"] in _UNGUARDED:
            await self.app(scope, receive, send)
            return
        detail: str | None = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
                if not allowed.allows_host(host):
                    detail = (
                        f"Host {host!r} is not one this server answers to: list it in "
                        "AGENT_ALLOWED_HOSTS (a guard against DNS rebinding)"
                    )
                    break
            elif name == b"origin":
                origin = value.decode("latin-1")
                if not allowed.allows_origin(origin):
                    detail = (
                        f"Origin {origin!r} may not call this server: list its host in "
                        "AGENT_ALLOWED_HOSTS or the origin in AGENT_CORS_ORIGINS"
                    )
                    break
        if detail is None:
            await self.app(scope, receive, send)
            return
        logger.info("refused a request to %s: %s", scope["path"], detail)
        await _refusal(scope["path"], detail)(scope, receive, send)
