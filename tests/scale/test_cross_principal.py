"""Another principal, on two workers: bob, on worker B, can neither see nor change alice's run
held by worker A, whatever ids he combines.

The attack this pins: bob names his own session (which he owns) with alice's run id in an
answer. The run is resolved with its owner and its own session in one place
(``RunContext.find``), so the answer is 404 like an unknown run; it must never reach A's run,
never resume it on B under bob's session's lease, never fence A off, and alice's own answer must
still be the one taken.
"""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.auth import API_KEYS, auth
from tests.support.authz import World, endpoints, waiting_run
from tests.support.cluster import StartCluster
from tests.support.problems import assert_problem
from tests.support.runs import events_so_far, follow
from tests.support.sse import assert_well_formed


async def test_bob_on_another_worker_cannot_reach_alices_run(start_cluster: StartCluster) -> None:
    a, b = start_cluster(2, {"AGENT_API_KEYS": API_KEYS, "AGENT_CONFIRMATION_TIMEOUT": "60"})
    alice, bob = auth("alice"), auth("bob")
    async with (
        a.client(headers=alice) as on_a,
        b.client() as on_b,
        b.client(headers=alice) as alice_on_b,
    ):
        done_session = f"alice-{uuid.uuid4().hex[:8]}"
        finished = await on_a.post(
            f"/v1/sessions/{done_session}/runs", json={"input": "hello", "stream": False}
        )
        assert finished.status_code == 200, finished.text
        waiting_session = f"alice-wait-{uuid.uuid4().hex[:8]}"
        run_id, call_id = await waiting_run(on_a, waiting_session)
        world = World(done_session, finished.json()["run_id"], waiting_session, run_id, call_id)
        mine = f"bob-{uuid.uuid4().hex[:8]}"
        own = await on_b.post(
            f"/v1/sessions/{mine}/runs", json={"input": "hi", "stream": False}, headers=bob
        )
        assert own.status_code == 200, own.text
        approve: dict[str, Any] = {
            "session_id": mine,
            "run_id": run_id,
            "name": "confirmation_response",
            "payload": {"tool_call_id": call_id, "approved": True},
        }
        attempts: list[tuple[str, str, dict[str, Any] | None]] = [
            *endpoints(world),
            # bob's own session with alice's run: the answer, with and without a call id
            ("POST", "/external-events", approve),
            ("POST", "/external-events", {**approve, "payload": {"approved": True}}),
        ]
        for method, path, body in attempts:
            response = await on_b.request(method, path, json=body, headers=bob)
            assert_problem(response, 404, "not_found")
        # bob's own session without a run id has nothing waiting: stale for him, nothing more
        stale = await on_b.post("/external-events", json={**approve, "run_id": None}, headers=bob)
        assert_problem(stale, 409, "not_accepted")

        # alice's run still waits, held by A: not resumed, not fenced, on either worker
        for client in (on_a, on_b):
            view = await client.get(f"/v1/runs/{run_id}", headers=alice)
            assert view.json()["status"] == "waiting", view.text
        logged = await events_so_far(alice_on_b, run_id)
        assert [e for e in logged if e.type == "run.resumed"] == []
        assert logged[-1].type == "custom"
        assert "resuming a run" not in b.log() and "fenced" not in a.log()

        # her own answer, a denial, is the one taken: the tool never runs
        deny = {
            "session_id": waiting_session,
            "run_id": run_id,
            "name": "confirmation_response",
            "payload": {"tool_call_id": call_id, "approved": False},
        }
        taken = await on_b.post("/external-events", json=deny, headers=alice)
        assert taken.status_code == 202, taken.text
        events = await follow(on_a, run_id)
        assert_well_formed(events, run_id)
        assert events[-1].type == "run.completed"
        assert "did not delete" in events[-1].data["data"]["output"]["content"]
        assert not any(e.type == "tool.call.completed" and "Deleted" in str(e.data) for e in events)
