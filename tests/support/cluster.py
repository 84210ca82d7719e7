"""Several ``agent-server`` processes on one Redis key prefix and one PostgreSQL schema."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.server import Server
from tests.support.sse import Event, open_stream

StartCluster = Callable[..., list[Server]]

# quick leases make a killed worker's runs end within seconds
LEASE_SECONDS = 2.0
CLUSTER_ENV = {
    "AGENT_LEASE_SECONDS": str(LEASE_SECONDS),
    "AGENT_DRAIN_TIMEOUT": "1",
}


def new_session() -> str:
    return f"scale-{uuid.uuid4().hex[:12]}"


async def run_view(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def read_until(
    client: httpx.AsyncClient, url: str, stop: Any, **kwargs: Any
) -> tuple[list[Event], str]:
    """Stream ``url`` until an event for which ``stop(event)`` holds; (events, run id)."""
    events: list[Event] = []
    async with open_stream(client, "POST" if "/sessions/" in url else "GET", url, **kwargs) as (
        response,
        stream,
    ):
        assert response.status_code == 200, await response.aread()
        run_id = response.headers["x-run-id"]
        async for event in stream:
            events.append(event)
            if stop(event):
                break
    return events, run_id


def is_confirmation(event: Event) -> bool:
    return event.type == "custom" and event.data["data"]["name"] == "confirmation_requested"
