"""Fixtures for in-process tests of the HTTP service: an app with its lifespan running."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.support.loopcheck import no_blocking_calls
from tests.support.served import MakeSettings, Serve, Served


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
            # the in-process client's base URL, http://test, names the host "test"
            "allowed_hosts": "localhost,127.0.0.1,::1,test",
        }
        values.update(overrides)
        return Settings(**values)

    return make


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
