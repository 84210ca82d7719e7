"""Alice's runs and sessions, and every protected endpoint that names them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.auth import API_KEYS
from tests.support.server import Server
from tests.support.sse import open_stream

AUTHZ_ENV = {"AGENT_API_KEYS": API_KEYS, "AGENT_CONFIRMATION_TIMEOUT": "60"}
"""The servers of the authorization matrices: alice's and bob's keys, and confirmations that
do not expire while a test runs."""


@dataclass(frozen=True)
class Layout:
    """Where alice's objects are made (``owner``) and where bob's attempts land (``other``)."""

    owner: Server
    other: Server


@dataclass
class World:
    """What alice owns: a finished run's session, and a run waiting for her confirmation."""

    done_session: str
    done_run: str
    waiting_session: str
    waiting_run: str
    tool_call_id: str


async def waiting_run(client: httpx.AsyncClient, session: str) -> tuple[str, str]:
    """Start a background run that waits for a confirmation; its id and the call's id."""
    started = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": "delete secret.txt", "background": True}
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]
    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (_, events):
        async for event in events:
            if event.type == "custom" and event.data["data"]["name"] == "confirmation_requested":
                return run_id, str(event.data["data"]["payload"]["tool_call_id"])
    raise AssertionError("the run never asked for a confirmation")


def endpoints(world: World) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every protected endpoint, naming alice's session or run."""
    answer = {
        "session_id": world.waiting_session,
        "run_id": world.waiting_run,
        "name": "confirmation_response",
        "payload": {"tool_call_id": world.tool_call_id, "approved": True},
    }
    return [
        ("POST", f"/v1/sessions/{world.done_session}/runs", {"input": "mine now"}),
        ("GET", f"/v1/runs/{world.done_run}", None),
        ("GET", f"/v1/runs/{world.done_run}/events", None),
        ("POST", f"/v1/runs/{world.waiting_run}/cancel", None),
        ("POST", "/external-events", answer),
        ("POST", "/external-events", {**answer, "run_id": None}),
        ("GET", f"/v1/sessions/{world.done_session}", None),
        ("GET", f"/v1/sessions/{world.done_session}/messages", None),
        ("DELETE", f"/v1/sessions/{world.done_session}", None),
        ("DELETE", f"/v1/sessions/{world.waiting_session}", None),
    ]
