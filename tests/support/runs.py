"""Durable runs over a cluster: background runs, their events read to the end, a worker killed."""

from __future__ import annotations

import asyncio
import signal
import uuid

import httpx

from tests.support.server import Server
from tests.support.sse import Event, open_stream, read_events

SLOW = " ".join(["slow"] + ["w"] * 60)


def new_session() -> str:
    return f"durable-{uuid.uuid4().hex[:12]}"


def kill(server: Server) -> None:
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)


async def follow(client: httpx.AsyncClient, run_id: str, after: int = 0) -> list[Event]:
    """The run's events after ``after``, read to the terminal event."""
    headers = {"Last-Event-ID": str(after)} if after else {}
    events, response = await read_events(
        client, "GET", f"/v1/runs/{run_id}/events", headers=headers
    )
    assert response.status_code == 200, response.text
    return events


def resumed(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "run.resumed"]


async def start_background(client: httpx.AsyncClient, session: str, text: str) -> str:
    started = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": text, "background": True}
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]
    return run_id


async def approve(client: httpx.AsyncClient, asked: Event) -> httpx.Response:
    """Approve the call a ``confirmation_requested`` event asks about."""
    payload = asked.data["data"]["payload"]
    return await client.post(
        "/external-events",
        json={
            "session_id": asked.data["session_id"],
            "run_id": asked.data["run_id"],
            "name": payload["response_event"],
            "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
        },
    )


async def events_so_far(client: httpx.AsyncClient, run_id: str) -> list[Event]:
    """The run's logged events now (read with a short timeout; the run goes on)."""
    events: list[Event] = []
    try:
        async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (response, stream):
            if response.status_code != 200:
                return events
            async with asyncio.timeout(0.5):
                async for event in stream:
                    events.append(event)
    except TimeoutError:
        pass
    return events


def is_request(event: Event) -> bool:
    return event.type == "custom" and event.data["data"]["name"] == "confirmation_requested"
