"""Fixtures for in-process tests of the HTTP service: an app with its lifespan running."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.server.services import Services
from app.settings import Settings
from tests.loopcheck import no_blocking_calls

from .asgi import ASGIRequest

MakeSettings = Callable[..., Settings]


@pytest.fixture
def make_settings(tmp_path: Path) -> MakeSettings:
    """Settings for a test: a fresh SQLite file, no token delay, small timeouts."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": f"sqlite:///{tmp_path}/agent.db",
            "demo_token_delay": 0.0,
            "demo_slow_seconds": 0.2,
            "drain_timeout": 5.0,
            "debug_endpoints": True,
            "redis_url": None,
            "api_keys": None,
            "config": None,
            "cors_origins": "",
        }
        values.update(overrides)
        return Settings(**values)

    return make


class Served:
    """An app whose lifespan is running, with a buffered client and a raw ASGI driver."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def services(self) -> Services:
        services = self.app.state.services
        assert isinstance(services, Services)
        return services

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        query: str = "",
    ) -> ASGIRequest:
        """A raw request, started."""
        raw = b"" if body is None else json.dumps(body).encode()
        all_headers = [("content-type", "application/json"), *(headers or {}).items()]
        return ASGIRequest(
            self.app, method, path, body=raw, headers=all_headers, query=query
        ).start()

    async def ready(self) -> None:
        """Wait for the warm-up (readiness)."""
        await wait_until(lambda: self.services.ready)

    async def wait_idle(self, within: float = 10.0) -> dict[str, Any]:
        """Wait until no run, task, lock or subscriber is left; the final debug state."""
        async with asyncio.timeout(within):
            while True:
                state = self.services.manager.debug_state()
                if _idle(state):
                    return state
                await asyncio.sleep(0.01)


def _idle(state: dict[str, Any]) -> bool:
    keys = (
        "runs",
        "tasks",
        "sse_streams",
        "blocking_waiters",
        "admission_running",
        "admission_queued",
        "admission_principals",
        "agent_active_runs",
        "agent_active_sessions",
        "subscribers",
        "locks",
        "routed_runs",
        "live_event_logs",
    )
    extensions_idle = all(
        counts["pending"] == 0 and counts["staged"] == 0 for counts in state["extensions"].values()
    )
    return extensions_idle and all(state[key] == 0 for key in keys)


Serve = Callable[..., contextlib.AbstractAsyncContextManager[Served]]


@pytest.fixture
def serve(make_settings: MakeSettings) -> Serve:
    """``async with serve(**settings) as served``: the app running in this test's loop."""

    @contextlib.asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[Served]:
        app = create_app(make_settings(**overrides), configure_logs=False)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                served = Served(app, client)
                await served.ready()
                with no_blocking_calls():
                    yield served

    return run


async def wait_until(check: Callable[[], bool | Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``check`` until it holds."""
    async with asyncio.timeout(within):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(0.01)
