"""Idempotent run starts over real HTTP: racing repeats, and two servers sharing Redis and
PostgreSQL (a key claimed on one is honoured on the other, and so are its stream tokens)."""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Any

import httpx
import pytest

from tests.support.server import Launch, Server, launch
from tests.support.services import shared_backend
from tests.support.sse import open_stream, read_events
from tests.support.waiting import wait_for, wait_until

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}


def session() -> str:
    return f"idem-{uuid.uuid4().hex[:10]}"


async def user_turns(client: httpx.AsyncClient, session_id: str, **kwargs: Any) -> list[str]:
    stored = (await client.get(f"/v1/sessions/{session_id}/messages", **kwargs)).json()
    return [m["content"] for m in stored["messages"] if m["role"] == "user"]


@pytest.mark.slow
async def test_a_thousand_racing_repeats_start_one_run(start_server: Launch) -> None:
    server = start_server({"AGENT_DEMO_SLOW_SECONDS": "0.05"})
    session_id = session()
    body = {"input": "slow race", "background": True}
    headers = {"Idempotency-Key": f"race-{uuid.uuid4()}"}
    # 100 connections (opened at once, more would overflow a small listen backlog and wait
    # for SYN retries), each carrying its share of the 1,000 requests as they race
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60.0, limits=limits) as client:
        gate = asyncio.Event()
        at_gate = 0

        async def send() -> httpx.Response:
            nonlocal at_gate
            at_gate += 1
            await gate.wait()
            return await client.post(f"/v1/sessions/{session_id}/runs", json=body, headers=headers)

        tasks = [asyncio.ensure_future(send()) for _ in range(1000)]
        await wait_until(lambda: at_gate == 1000)  # every request waits at the gate
        gate.set()
        answers = await asyncio.gather(*tasks)
        statuses = collections.Counter(a.status_code for a in answers)
        # every answer names the one run; a repeat that found the first still being admitted
        # for longer than it waits may be told to retry, never given a second run
        assert set(statuses) <= {202, 409}, statuses
        accepted = [a for a in answers if a.status_code == 202]
        assert len({a.json()["run_id"] for a in accepted}) == 1
        assert sum(a.headers.get("idempotent-replayed") is None for a in accepted) == 1
        for refused in (a for a in answers if a.status_code == 409):
            assert refused.json()["code"] == "idempotency_key_in_flight"
            assert refused.headers["retry-after"]
        run_id = accepted[0].json()["run_id"]

        async def ended() -> bool:
            view = (await client.get(f"/v1/runs/{run_id}")).json()
            return bool(view["status"] == "completed")

        await wait_for(ended)
        assert await user_turns(client, session_id) == ["slow race"]
        sessions = (await client.get("/v1/sessions", params={"limit": 100})).json()["sessions"]
        assert [s["last_run_id"] for s in sessions if s["session_id"] == session_id] == [run_id]


@pytest.mark.redis
@pytest.mark.postgres
async def test_two_servers_share_keys_grace_and_stream_tokens(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with shared_backend() as env:
        env = {
            **env,
            "AGENT_DEMO_SLOW_SECONDS": "0.1",
            "AGENT_API_KEYS": "key-a=alice,key-b=bob",
            # long enough that the repeat on the other server certainly comes within it
            "AGENT_DISCONNECT_GRACE": "30",
        }
        one = launch(tmp_path_factory.mktemp("idem-one"), env)
        two = launch(tmp_path_factory.mktemp("idem-two"), env)
        try:
            async with one.client(headers=ALICE) as on_one, two.client(headers=ALICE) as on_two:
                await _cut_on_one_resumed_on_two(on_one, on_two)
                await _blocking_repeat_waits_on_the_other(on_one, on_two)
                await _tokens_of_one_read_on_two(on_one, two)
        finally:
            one.stop()
            two.stop()


async def _cut_on_one_resumed_on_two(on_one: httpx.AsyncClient, on_two: httpx.AsyncClient) -> None:
    session_id = session()
    key = {"Idempotency-Key": f"cut-{uuid.uuid4()}"}
    body = {"input": "slow " + " ".join(f"w{i}" for i in range(20))}
    url = f"/v1/sessions/{session_id}/runs"
    seen = []
    async with open_stream(on_one, "POST", url, json=body, headers=key) as (response, events):
        run_id = response.headers["x-run-id"]
        async for event in events:
            seen.append(event)
            if event.type == "text.delta":
                break  # the client is cut; the run's worker starts its grace
    headers = {**key, "Last-Event-ID": str(seen[-1].id)}
    rest, repeat = await read_events(on_two, "POST", url, json=body, headers=headers)
    assert repeat.headers["x-run-id"] == run_id
    assert repeat.headers["idempotent-replayed"] == "true"
    whole = seen + rest
    assert [e.id for e in whole] == list(range(1, len(whole) + 1))
    assert whole[-1].type == "run.completed"
    assert await user_turns(on_two, session_id) == [body["input"]]
    # the same key for another body, on either server
    other = await on_two.post(url, json={"input": "other"}, headers=key)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    # bob's identical key is his own: a run of his own
    bobs = await on_two.post(
        f"/v1/sessions/{session()}/runs",
        json={**body, "stream": False},
        headers={**key, **BOB},
    )
    assert bobs.status_code == 200 and bobs.json()["run_id"] != run_id
    # at the terminal event, a repeat is told the run has nothing more: 204
    done = await on_one.post(url, json=body, headers={**key, "Last-Event-ID": str(whole[-1].id)})
    assert done.status_code == 204


async def _blocking_repeat_waits_on_the_other(
    on_one: httpx.AsyncClient, on_two: httpx.AsyncClient
) -> None:
    session_id = session()
    key = {"Idempotency-Key": f"json-{uuid.uuid4()}"}
    body = {"input": "slow a b c d e f g h", "stream": False}
    url = f"/v1/sessions/{session_id}/runs"
    first = asyncio.ensure_future(on_one.post(url, json=body, headers=key))

    async def running() -> str | None:
        view = await on_two.get(f"/v1/sessions/{session_id}")
        return view.json()["active_run_id"] if view.status_code == 200 else None

    run_id = await wait_for(running)
    repeat = await on_two.post(url, json=body, headers=key)
    answer = await first
    assert repeat.status_code == 200
    assert repeat.headers["x-run-id"] == run_id
    assert repeat.json() == answer.json()
    assert answer.json()["status"] == "completed"


async def _tokens_of_one_read_on_two(on_one: httpx.AsyncClient, two: Server) -> None:
    started = await on_one.post(
        f"/v1/sessions/{session()}/runs", json={"input": "slow x y", "background": True}
    )
    events_url = started.json()["events_url"]
    assert "?token=" in events_url
    # no API key: the token, made by one, is good on two (one secret per deployment)
    async with two.client() as anonymous:
        events, response = await read_events(anonymous, "GET", events_url)
        assert response.status_code == 200
        assert events[-1].type == "run.completed"
        refused = await anonymous.get(events_url.split("?")[0])
        assert refused.status_code == 401
