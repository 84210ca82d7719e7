"""The bus: event logs, session locks and command routing (see ``app.bus.base``).

``open_bus(settings)`` picks the implementation: in-process without ``AGENT_REDIS_URL``,
Redis with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from app.bus.base import (
    TERMINAL_TYPES,
    Bus,
    BusError,
    BusUnavailable,
    CommandHandler,
    EventLog,
    Lease,
    LeaseLost,
    LogNotFound,
    Router,
    SessionLocks,
    SharedValues,
    Subscription,
    WireEvent,
)
from app.bus.local import LocalBus

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = [
    "TERMINAL_TYPES",
    "Bus",
    "BusError",
    "BusUnavailable",
    "CommandHandler",
    "EventLog",
    "Lease",
    "LeaseLost",
    "LocalBus",
    "LogNotFound",
    "Router",
    "SessionLocks",
    "SharedValues",
    "Subscription",
    "WireEvent",
    "open_bus",
]


async def open_bus(settings: Settings) -> Bus:
    """The bus for these settings; a Redis bus when ``AGENT_REDIS_URL`` is set."""
    if settings.redis_url is None:
        return LocalBus(
            event_log_ttl=settings.event_log_ttl, max_events=settings.event_log_max_events
        )
    try:
        module = importlib.import_module("app.bus.redis")
    except ImportError as exc:
        raise RuntimeError(
            "AGENT_REDIS_URL is set but this build has no Redis bus (app.bus.redis); "
            "unset AGENT_REDIS_URL to run one worker with the in-process bus"
        ) from exc
    opener: Any = module.open_redis_bus
    bus: Bus = await opener(settings)
    return bus
