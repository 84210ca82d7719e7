"""What a worker's requests share, built by the lifespan on the worker's own event loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from agent_runtime.agent import AgentCore
from app.admission.slots import Admission
from app.agents.build import ConfiguredAgents
from app.bus.base import Bus
from app.errors import Unavailable
from app.files import FileRetention, FileService
from app.runs import RunManager
from app.server.readiness import DependencyWatch
from app.settings import Settings
from app.storage import Store
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing

if TYPE_CHECKING:
    from app.auth.stream_tokens import StreamTokens
    from app.capabilities.jobs import MediaJobs
    from app.runs.stateless import StatelessReaper
    from app.schedules import Scheduler, Schedules
    from app.webhooks.hooks import RunWebhooks

__all__ = ["Services", "ServicesDep", "get_services"]


@dataclass(eq=False)
class Services:
    """One worker's agents, store, bus, admission and run manager.

    ``agent`` is the ``default`` agent; ``agents`` holds every configured one and the MCP
    clients they share.
    """

    settings: Settings
    metrics: Metrics
    store: Store
    bus: Bus
    agent: AgentCore
    agents: ConfiguredAgents
    admission: Admission
    manager: RunManager
    dependencies: DependencyWatch | None = None
    ready: bool = False
    readiness_problem: str = "warming up"
    notes: dict[str, str] = field(default_factory=dict)
    media: MediaJobs | None = None
    """The worker's media jobs (``POST /v1/media/...``)."""
    stream_tokens: StreamTokens | None = None
    """Signs the ``events_url`` tokens; None when authentication is off."""
    tracing: Tracing | None = None
    """The worker's trace pipeline (``app.telemetry.tracing``); None when ``OTEL_*`` asks for
    none."""
    webhooks: RunWebhooks | None = None
    """The runs' webhooks and this worker's sender; None when no signing secret is set."""
    schedules: Schedules | None = None
    """The principals' schedules (``/v1/schedules``)."""
    scheduler: Scheduler | None = None
    """This worker's scheduler (started by the lifespan); None with
    ``AGENT_SCHEDULER_ENABLED=0``."""
    stateless: StatelessReaper | None = None
    """Deletes stateless sessions idle past ``AGENT_STATELESS_RETENTION`` (started by the
    lifespan)."""
    files: FileService | None = None
    """The principals' files (``/v1/files``), also the agents' content store."""
    file_retention: FileRetention | None = None
    """Deletes unreferenced files older than ``AGENT_FILE_RETENTION`` (started by the
    lifespan)."""

    @property
    def readiness(self) -> str:
        """What ready means here: ``answered`` (every required agent's model answered its
        warm-up call) or ``configured`` (``AGENT_WARMUP=0``: no warm-up call was made)."""
        return "answered" if self.settings.warmup else "configured"


async def get_services(request: Request) -> Services:
    """FastAPI dependency: the worker's services (503 before startup finished); async, so
    FastAPI calls it inline instead of in its thread pool."""
    services: Services | None = getattr(request.app.state, "services", None)
    if services is None:
        raise Unavailable("the server is starting", retry_after=1)
    return services


ServicesDep = Annotated[Services, Depends(get_services)]
