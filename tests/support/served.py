"""An app whose lifespan runs in the test's own loop, driven by a buffered client or raw ASGI,
and the checks of its answers (problems, well-formed SSE frames)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI

from app.server.services import Services
from app.settings import Settings
from tests.support.asgi import ASGIRequest, Frame
from tests.support.waiting import wait_until

MakeSettings = Callable[..., Settings]


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


PROBLEM = "application/problem+json"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert {"type", "title", "detail"} <= body.keys()
    assert "Traceback" not in response.text
    return body


async def run_blocking(
    served: Served,
    session: str,
    text: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    return await served.client.post(
        f"/v1/sessions/{session}/runs",
        json={"input": text, "stream": False, **extra},
        headers=headers,
    )


TERMINAL = {"run.completed", "run.failed", "run.cancelled"}


def assert_well_formed(events: list[Frame], run_id: str) -> None:
    assert [f.id for f in events] == list(range(1, len(events) + 1))
    for frame in events:
        data = frame.data
        assert data is not None
        assert data["seq"] == frame.id
        assert data["type"] == frame.event
        assert data["run_id"] == run_id
        assert data["ts"].endswith("Z") and len(data["ts"]) == len("2026-11-30T12:00:00.000Z")
    terminals = [f for f in events if f.event in TERMINAL]
    assert len(terminals) == 1
    assert events[-1] is terminals[0]


async def replay(served: Served, run_id: str, after: int = 0) -> list[Frame]:
    request = served.request("GET", f"/v1/runs/{run_id}/events", query=f"after={after}")
    await request.finish()
    return request.events()
