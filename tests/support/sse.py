"""Reading a server's SSE responses: events as received, and the checks every stream passes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse

TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled"})


@dataclass(frozen=True)
class Event:
    """One SSE event as received."""

    id: int
    type: str
    data: dict[str, Any]


def to_event(sse: Any) -> Event:
    data = json.loads(sse.data)
    assert isinstance(data, dict)
    return Event(int(sse.id), sse.event, data)


async def read_events(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    stop_after: int | None = None,
    **kwargs: Any,
) -> tuple[list[Event], httpx.Response]:
    """Read an SSE response to its end (or ``stop_after`` events, then close it)."""
    events: list[Event] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        response = source.response
        if response.status_code != 200:
            await response.aread()
            return events, response
        async for sse in source.aiter_sse():
            events.append(to_event(sse))
            if stop_after is not None and len(events) >= stop_after:
                break
    return events, response


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[Event]]]:
    """An SSE response and an iterator over its events; closed on exit."""
    async with aconnect_sse(client, method, url, **kwargs) as source:

        async def events() -> AsyncIterator[Event]:
            async for sse in source.aiter_sse():
                yield to_event(sse)

        yield source.response, events()


def assert_well_formed(events: list[Event], run_id: str) -> None:
    """Ids rise by one from 1, every event carries the run, one terminal and it is last."""
    assert events, "no events"
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    for event in events:
        assert event.data["seq"] == event.id
        assert event.data["type"] == event.type
        assert event.data["run_id"] == run_id
        assert event.data["ts"].endswith("Z")
        assert set(event.data) == {"type", "seq", "run_id", "session_id", "ts", "data"}
    assert [e.type in TERMINAL for e in events].count(True) == 1
    assert events[-1].type in TERMINAL
