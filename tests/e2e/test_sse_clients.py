"""Real third-party SSE clients through a proxy that cuts their connections mid-stream.

npm ``eventsource`` (the WHATWG EventSource) and ``@microsoft/fetch-event-source`` (pinned in
tests/js, driven by tests/js/sse_scenarios.mjs) and PyPI's ``httpx-sse`` read a real server
through ``CuttingProxy``, which cuts answers at random body offsets with FINs and RSTs. Each
check compares the whole event sequence a client assembled with an uncut read of the same
run's log, and what the server kept (one run, one stored user turn).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.fakes.tcp_proxy import CuttingProxy
from tests.support import npm as npm_clients
from tests.support.npm import JS
from tests.support.server import Launch, Server
from tests.support.sse import Event, read_events, to_event

TYPES = [
    "run.started",
    "text.delta",
    "tool.call.started",
    "tool.call.completed",
    "custom",
    "usage",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.resumed",
]
# long enough to be cut many times: each word is one text.delta event
WORDS = " ".join(f"w{i}" for i in range(80))


@pytest.fixture
def sse_server(start_server: Launch) -> Server:
    # a short retry: the clients reconnect after 50 ms (the server's retry: field);
    # tokens come one per 5 ms, so the run is live while its readers are cut
    return start_server({"AGENT_SSE_RETRY_MS": "50", "AGENT_DEMO_TOKEN_DELAY": "0.005"})


@pytest.fixture
def proxy(sse_server: Server) -> Iterator[CuttingProxy]:
    port = sse_server.port
    with CuttingProxy(port, seed=15, cuts=12, min_bytes=100, max_bytes=2500) as cutting:
        yield cutting


def node_sse(scenario: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one scenario of tests/js/sse_scenarios.mjs in its own process (off the loop)."""
    done = subprocess.run(
        [npm_clients.node(), str(JS / "sse_scenarios.mjs"), scenario, json.dumps(arguments)],
        cwd=JS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr}\n{done.stdout}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def as_events(seen: list[dict[str, Any]]) -> list[Event]:
    return [Event(int(e["id"]), e["type"], e["data"]) for e in seen]


async def uncut(server: Server, run_id: str) -> list[Event]:
    async with server.client() as client:
        events, response = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    assert response.status_code == 200
    return events


async def user_turns(server: Server, session_id: str) -> list[str]:
    async with server.client() as client:
        stored = (await client.get(f"/v1/sessions/{session_id}/messages")).json()
    return [m["content"] for m in stored["messages"] if m["role"] == "user"]


def proxied(proxy: CuttingProxy) -> str:
    return f"http://127.0.0.1:{proxy.port}"


async def test_eventsource_resumes_through_cuts_and_stops_at_204(
    sse_server: Server, proxy: CuttingProxy
) -> None:
    async with sse_server.client() as client:
        started = await client.post(
            f"/v1/sessions/es-{uuid.uuid4().hex[:8]}/runs",
            json={"input": WORDS, "background": True},
        )
    assert started.status_code == 202
    run_id = started.json()["run_id"]
    url = proxied(proxy) + started.json()["events_url"]
    # the client follows the live run, is cut, resumes with Last-Event-ID, and is never
    # closed by the script: only the server's 204 stops it
    seen = await asyncio.to_thread(node_sse, "eventsource", {"url": url, "types": TYPES})
    print(
        f"eventsource: {len(seen['events'])} events, {proxy.cut_count} cuts "
        f"({proxy.resets} resets), {seen['opens']} opens, then {seen['errors'][-1]}"
    )
    assert proxy.cut_count >= 4 and proxy.resets >= 2, vars(proxy)
    assert as_events(seen["events"]) == await uncut(sse_server, run_id)
    assert seen["events"][-1]["type"] == "run.completed"
    assert seen["ready_state"] == 2  # CLOSED, by itself
    assert seen["errors"][-1]["code"] == 204
    # an open per cut stream and one for the stream that ended: the 204 opened nothing
    assert seen["opens"] == proxy.cut_count + 1


async def test_fetch_event_source_retried_post_attaches_to_the_first_run(
    sse_server: Server, proxy: CuttingProxy
) -> None:
    session_id = f"fes-{uuid.uuid4().hex[:8]}"
    arguments = {
        "url": f"{proxied(proxy)}/v1/sessions/{session_id}/runs",
        "body": {"input": WORDS, "on_disconnect": "cancel"},
        "headers": {"Idempotency-Key": f"send-{uuid.uuid4()}"},
    }
    seen = await asyncio.to_thread(node_sse, "fetch-event-source", arguments)
    attempts = seen["attempts"]
    print(
        f"fetch-event-source: {len(seen['events'])} events, {proxy.cut_count} cuts "
        f"({proxy.resets} resets), {len(attempts)} POSTs, Last-Event-ID corrected "
        f"{seen['corrected']} times"
    )
    assert proxy.cut_count >= 4, vars(proxy)
    assert len(attempts) >= 5
    run_ids = {a["run_id"] for a in attempts}
    assert len(run_ids) == 1, attempts
    assert [a["replayed"] for a in attempts] == [None] + ["true"] * (len(attempts) - 1)
    assert all(a["status"] in (200, 204) for a in attempts), attempts
    (run_id,) = run_ids
    # every event once, in order, as an uncut read has them; the run was never cancelled by
    # the cuts (the disconnect grace saw the retry re-attach)
    assert as_events(seen["events"]) == await uncut(sse_server, run_id)
    assert seen["events"][-1]["type"] == "run.completed"
    assert await user_turns(sse_server, session_id) == [WORDS]


async def test_httpx_sse_resumes_with_last_event_id_through_cuts(
    sse_server: Server, proxy: CuttingProxy
) -> None:
    async with sse_server.client() as client:
        started = await client.post(
            f"/v1/sessions/hx-{uuid.uuid4().hex[:8]}/runs",
            json={"input": WORDS, "background": True},
        )
        run_id = started.json()["run_id"]
    events: list[Event] = []
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=proxied(proxy), timeout=30) as cut_client:
        for _ in range(100):
            headers = {"Last-Event-ID": str(events[-1].id)} if events else {}
            try:
                async with aconnect_sse(
                    cut_client, "GET", f"/v1/runs/{run_id}/events", headers=headers
                ) as source:
                    statuses.append(source.response.status_code)
                    if source.response.status_code == 204:
                        break
                    async for sse in source.aiter_sse():
                        events.append(to_event(sse))
            except httpx.TransportError:
                continue
    print(f"httpx-sse: {len(events)} events, {proxy.cut_count} cuts, statuses {statuses}")
    assert statuses[-1] == 204
    assert proxy.cut_count >= 4
    assert events == await uncut(sse_server, run_id)
