"""The authorization matrix: every endpoint, for the owner, another principal, no key, a wrong key.

With ``AGENT_API_KEYS`` set, a request without a valid bearer key is 401 ``unauthorized`` (with
``WWW-Authenticate``) on every protected endpoint, whether or not what it names exists. Another
principal is told that the owner's sessions and runs do not exist: 404 ``not_found``, the very
answer an unknown id gets, never 403, and nothing changes: a cancel does not cancel, a delete
does not delete, a run started in the owner's session is refused, and a confirmation answer
never reaches the owner's waiting run (which still waits, and takes its owner's answer after).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.support.auth import API_KEYS, auth
from tests.support.authz import World, endpoints, waiting_run
from tests.support.probes import wait_idle
from tests.support.problems import assert_problem
from tests.support.server import Server, launch, stop
from tests.support.sse import read_events


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp("authz"),
        {"AGENT_API_KEYS": API_KEYS, "AGENT_CONFIRMATION_TIMEOUT": "60"},
    )
    yield running
    stop(running, request, failed)


@pytest.fixture
async def world(server: Server) -> AsyncIterator[World]:
    async with server.client(headers=auth("alice")) as client:
        done_session = f"alice-{uuid.uuid4().hex[:8]}"
        events, response = await read_events(
            client, "POST", f"/v1/sessions/{done_session}/runs", json={"input": "hello"}
        )
        assert events[-1].type == "run.completed"
        waiting_session = f"alice-wait-{uuid.uuid4().hex[:8]}"
        run_id, call_id = await waiting_run(client, waiting_session)
        yield World(done_session, response.headers["x-run-id"], waiting_session, run_id, call_id)
        await client.post(f"/v1/runs/{run_id}/cancel")


BAD_CREDENTIALS = [
    pytest.param({}, id="no-key"),
    pytest.param({"Authorization": "Bearer not-a-key"}, id="wrong-key"),
    pytest.param({"Authorization": f"Bearer {API_KEYS.split('=')[0]}x"}, id="a-key-plus-one"),
    pytest.param({"Authorization": f"Basic {API_KEYS.split('=')[0]}"}, id="wrong-scheme"),
    pytest.param({"Authorization": "Bearer"}, id="bare-bearer"),
    pytest.param({"Authorization": ""}, id="empty-header"),
]


async def still_waiting(client: httpx.AsyncClient, world: World) -> None:
    run = (await client.get(f"/v1/runs/{world.waiting_run}", headers=auth("alice"))).json()
    assert run["status"] == "waiting", run
    session = await client.get(f"/v1/sessions/{world.done_session}", headers=auth("alice"))
    assert session.status_code == 200
    assert session.json()["message_count"] == 2


@pytest.mark.parametrize("headers", BAD_CREDENTIALS)
async def test_without_a_valid_key_every_endpoint_is_401(
    server: Server, world: World, headers: dict[str, str]
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        for method, path, body in [
            *endpoints(world),
            ("GET", "/v1/runs/run_unknown", None),
            ("GET", "/v1/sessions/unknown", None),
            ("POST", "/v1/sessions/new-one/runs", {"input": "x"}),
            ("GET", "/debug/state", None),
        ]:
            response = await client.request(method, path, json=body, headers=headers)
            assert_problem(response, 401, "unauthorized")
            assert response.headers["www-authenticate"].startswith("Bearer")
        for path in ("/healthz", "/readyz", "/metrics", "/"):
            assert (await client.get(path, headers=headers)).status_code == 200
        await still_waiting(client, world)
        assert (await client.get("/v1/sessions/new-one", headers=auth("alice"))).status_code == 404


async def test_another_principal_is_told_nothing_exists(server: Server, world: World) -> None:
    nobody = World("nobody-1", "run_" + "0" * 32, "nobody-2", "run_" + "1" * 32, "call_x")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        for (method, path, body), (_, twin_path, twin_body) in zip(
            endpoints(world), endpoints(nobody), strict=True
        ):
            response = await client.request(method, path, json=body, headers=auth("bob"))
            problem = assert_problem(response, 404, "not_found")
            if method == "POST" and path.endswith("/runs"):
                continue  # for a session nobody owns, this would start bob's own run
            # the very answer an id that never existed gets (bar the id in the detail)
            twin = await client.request(method, twin_path, json=twin_body, headers=auth("bob"))
            twin_problem = assert_problem(twin, 404, "not_found")
            assert problem.keys() == twin_problem.keys()
            assert (problem["type"], problem["title"]) == (
                twin_problem["type"],
                twin_problem["title"],
            )
        await still_waiting(client, world)
        # nothing of bob's appeared in alice's session, and alice's answer still gets through
        alice = auth("alice")
        answer = {
            "session_id": world.waiting_session,
            "run_id": world.waiting_run,
            "name": "confirmation_response",
            "payload": {"tool_call_id": world.tool_call_id, "approved": False},
        }
        accepted = await client.post("/external-events", json=answer, headers=alice)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}
        async with asyncio.timeout(10):
            events, _ = await read_events(
                client, "GET", f"/v1/runs/{world.waiting_run}/events", headers=alice
            )
        assert events[-1].type == "run.completed"
        assert "did not delete" in events[-1].data["data"]["output"]["content"]
        # bob's own session of the same name as nothing of alice's is his
        mine = await client.post(
            "/v1/sessions/bob-own/runs", json={"input": "hi", "stream": False}, headers=auth("bob")
        )
        assert mine.status_code == 200
        assert (await client.get("/v1/sessions/bob-own", headers=alice)).status_code == 404


async def test_the_owner_reaches_everything(server: Server, world: World) -> None:
    alice = auth("alice")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10, headers=alice) as client:
        assert (await client.get(f"/v1/runs/{world.done_run}")).json()["status"] == "completed"
        events, response = await read_events(client, "GET", f"/v1/runs/{world.done_run}/events")
        assert response.status_code == 200 and events[-1].type == "run.completed"
        session = (await client.get(f"/v1/sessions/{world.done_session}")).json()
        assert session["last_run_id"] == world.done_run
        messages = (await client.get(f"/v1/sessions/{world.done_session}/messages")).json()
        assert len(messages["messages"]) == 2
        busy = await client.delete(f"/v1/sessions/{world.waiting_session}")
        assert_problem(busy, 409, "session_busy")
        answer = {
            "session_id": world.waiting_session,
            "run_id": world.waiting_run,
            "name": "confirmation_response",
            "payload": {"tool_call_id": world.tool_call_id, "approved": True},
        }
        assert (await client.post("/external-events", json=answer)).status_code == 202
        # a second answer to the same call is stale
        again = await client.post("/external-events", json=answer)
        assert_problem(again, 409, "not_accepted")
        async with asyncio.timeout(10):
            events, _ = await read_events(client, "GET", f"/v1/runs/{world.waiting_run}/events")
        assert "Deleted secret.txt" in events[-1].data["data"]["output"]["content"]
        cancelled = await client.post(f"/v1/runs/{world.waiting_run}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "completed"
        assert (await client.delete(f"/v1/sessions/{world.done_session}")).status_code == 204
        assert (await client.get(f"/v1/sessions/{world.done_session}")).status_code == 404
        assert (await client.get("/debug/state")).status_code == 200
        await wait_idle(client)


async def test_bobs_own_session_with_alices_run_changes_nothing(
    server: Server, world: World
) -> None:
    bob = auth("bob")
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        mine = f"bob-{uuid.uuid4().hex[:8]}"
        own = await client.post(
            f"/v1/sessions/{mine}/runs", json={"input": "hi", "stream": False}, headers=bob
        )
        assert own.status_code == 200, own.text
        answer = {
            "session_id": mine,
            "run_id": world.waiting_run,
            "name": "confirmation_response",
            "payload": {"tool_call_id": world.tool_call_id, "approved": True},
        }
        for body in (answer, {**answer, "payload": {"approved": True}}):
            response = await client.post("/external-events", json=body, headers=bob)
            assert_problem(response, 404, "not_found")
        await still_waiting(client, world)
        # alice's run under another of her own sessions is not that session's either
        alice = auth("alice")
        elsewhere = {**answer, "session_id": world.done_session}
        assert_problem(
            await client.post("/external-events", json=elsewhere, headers=alice), 404, "not_found"
        )
        await still_waiting(client, world)
        # nor can bob continue alice's conversation from his session: her run is as unknown
        # there as a run that never existed, and alice's own run branches only in its session
        fresh = f"alice-{uuid.uuid4().hex[:8]}"
        for who, session, run_id in (
            (bob, mine, world.done_run),
            (bob, mine, "run_" + "0" * 32),
            (alice, fresh, world.done_run),
        ):
            start: dict[str, Any] = {"input": "go on", "stream": False, "branch_from": run_id}
            refused = await client.post(f"/v1/sessions/{session}/runs", json=start, headers=who)
            problem = assert_problem(refused, 404, "not_found")
            assert problem.keys() == {"type", "title", "status", "detail", "code"}
        assert (await client.get(f"/v1/sessions/{fresh}", headers=alice)).status_code == 404
        assert (await client.get(f"/v1/sessions/{mine}", headers=bob)).json()["message_count"] == 2
        await still_waiting(client, world)
