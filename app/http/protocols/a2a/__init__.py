"""A2A 1.0: the agent cards and ``/a2a/{agent}`` (JSON-RPC and HTTP+JSON), over the runs."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.responses import Response

from app.errors import Unavailable
from app.http.protocols.a2a.caching import card_response
from app.http.protocols.loading import DeferredEndpoint
from app.settings import Settings

if TYPE_CHECKING:
    from app.http.protocols.a2a.endpoint import A2AEndpoint

__all__ = ["install_a2a"]

# the SDK's streams outlive the drain's own deadline by this much, so that a stream ends with
# its task's last event rather than being cut when the server starts shutting down
_GRACE_BEYOND_DRAIN = 15.0


def install_a2a(app: FastAPI, settings: Settings) -> None:
    """Serve the service's agent card and mount ``/a2a`` (the SDK loads on the first request
    to either: see ``app.http.protocols.loading``)."""

    def build(module: ModuleType) -> A2AEndpoint:
        built: A2AEndpoint = module.A2AEndpoint(
            v03=settings.a2a_v03,
            shutdown_grace_period=settings.drain_timeout + _GRACE_BEYOND_DRAIN,
        )
        return built

    endpoint = DeferredEndpoint("app.http.protocols.a2a.endpoint", build)

    async def agent_card(request: Request) -> Response:
        services = request.app.state.services
        if services is None:
            raise Unavailable("the server is starting", retry_after=1)
        module = await endpoint.module()
        return card_response(request, module.service_card(request, services))

    app.add_api_route(
        "/.well-known/agent-card.json",
        agent_card,
        methods=["GET"],
        summary="The A2A agent card",
        include_in_schema=False,  # the A2A specification describes it
    )
    app.mount("/a2a", endpoint, name="a2a")
