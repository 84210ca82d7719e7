"""Three worker processes on three ports, sharing Redis and PostgreSQL: a run is reachable
from every worker, a session has one active run across all of them, and a worker killed
mid-run leaves its runs ending ``worker_lost`` (resume off) for readers on the surviving
workers."""

from __future__ import annotations

import asyncio
import signal
import time

from tests.support.cluster import (
    LEASE_SECONDS,
    StartCluster,
    is_confirmation,
    new_session,
    read_until,
    run_view,
)
from tests.support.server import Server
from tests.support.sse import Event, assert_well_formed, open_stream, read_events
from tests.support.waiting import wait_for


async def test_a_run_is_reachable_from_every_worker(start_cluster: StartCluster) -> None:
    one, two, three = start_cluster(3)
    async with one.client() as c1, two.client() as c2, three.client() as c3:
        # started on worker 1; the client leaves once asked for a confirmation
        session = new_session()
        first, run_id = await read_until(
            c1,
            f"/v1/sessions/{session}/runs",
            is_confirmation,
            json={"input": "delete plans.md", "on_disconnect": "continue"},
        )
        request = first[-1].data["data"]["payload"]

        async def waiting() -> bool:
            return bool((await run_view(c3, run_id))["status"] == "waiting")

        await wait_for(waiting)
        summary = (await c3.get(f"/v1/sessions/{session}")).json()
        assert summary["active_run_id"] == run_id
        # answered through worker 2, which does not hold the run
        answer = {
            "session_id": session,
            "run_id": run_id,
            "name": request["response_event"],
            "payload": {"tool_call_id": request["tool_call_id"], "approved": True},
        }
        accepted = await c2.post("/external-events", json=answer)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}
        duplicate = await c3.post("/external-events", json=answer)
        assert duplicate.status_code == 409
        assert duplicate.json()["accepted_by"] == []
        # resumed from worker 3 after the last event the client saw: no gap, no duplicate
        rest, response = await read_events(
            c3, "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
        )
        assert response.status_code == 200
        assert_well_formed(first + rest, run_id)
        assert rest[-1].type == "run.completed"
        assert "Deleted plans.md" in rest[-1].data["data"]["output"]["content"]
        replay, _ = await read_events(c2, "GET", f"/v1/runs/{run_id}/events")
        assert replay == first + rest
        assert (await run_view(c2, run_id))["status"] == "completed"
        messages = (await c3.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        assert messages[0]["role"] == "user"

        # an answer without a run id goes to whichever run holds the session
        again, second_id = await read_until(
            c1,
            f"/v1/sessions/{session}/runs",
            is_confirmation,
            json={"input": "delete notes.md", "on_disconnect": "continue"},
        )
        payload = again[-1].data["data"]["payload"]
        denied = await c3.post(
            "/external-events",
            json={
                "session_id": session,
                "run_id": None,
                "name": payload["response_event"],
                "payload": {"tool_call_id": payload["tool_call_id"], "approved": False},
            },
        )
        assert denied.status_code == 202, denied.text
        rest, _ = await read_events(
            c2, "GET", f"/v1/runs/{second_id}/events", headers={"Last-Event-ID": str(again[-1].id)}
        )
        assert_well_formed(again + rest, second_id)
        assert "did not delete notes.md" in rest[-1].data["data"]["output"]["content"]

        # cancelled through worker 2, followed on worker 3
        slow = " ".join(["slow"] + ["w"] * 100)
        started = await c1.post(
            f"/v1/sessions/{new_session()}/runs", json={"input": slow, "background": True}
        )
        assert started.status_code == 202
        slow_id = started.json()["run_id"]
        async with open_stream(c3, "GET", f"/v1/runs/{slow_id}/events") as (response, stream):
            assert response.status_code == 200
            followed: list[Event] = []
            async for event in stream:
                followed.append(event)
                if event.type == "text.delta" and len(followed) == 3:
                    cancel = await c2.post(f"/v1/runs/{slow_id}/cancel")
                    assert cancel.status_code == 202, cancel.text
                    assert cancel.json()["status"] in ("running", "cancelling", "waiting")
        assert_well_formed(followed, slow_id)
        assert followed[-1].type == "run.cancelled"
        assert followed[-1].data["data"] == {"reason": "cancel_requested"}
        done = await c2.post(f"/v1/runs/{slow_id}/cancel")
        assert done.status_code == 200 and done.json()["status"] == "cancelled"
        assert (await run_view(c1, slow_id))["status"] == "cancelled"


async def test_one_active_run_per_session_across_workers(start_cluster: StartCluster) -> None:
    servers = start_cluster(3)
    clients = [server.client() for server in servers]
    try:
        session = new_session()
        for round_ in range(3):
            # the admitted run waits for a confirmation: it holds the session until cancelled
            answers = await asyncio.gather(
                *(
                    clients[index % 3].post(
                        f"/v1/sessions/{session}/runs",
                        json={"input": "delete x.txt", "background": True},
                    )
                    for index in range(20)
                )
            )
            statuses = sorted(answer.status_code for answer in answers)
            assert statuses == [202] + [409] * 19, (round_, statuses)
            (admitted,) = [a.json()["run_id"] for a in answers if a.status_code == 202]
            for answer in answers:
                if answer.status_code == 409:
                    body = answer.json()
                    assert body["code"] == "session_busy"
                    assert body["active_run_id"] in (admitted, None)
            cancel = await clients[(round_ + 1) % 3].post(f"/v1/runs/{admitted}/cancel")
            assert cancel.status_code == 202
            # it ends on its worker; any worker then finds the session free again
            events, _ = await read_events(clients[2], "GET", f"/v1/runs/{admitted}/events")
            assert_well_formed(events, admitted)
            assert events[-1].type == "run.cancelled"
        final = await clients[1].post(
            f"/v1/sessions/{session}/runs", json={"input": "hello", "stream": False}
        )
        assert final.status_code == 200
        history = (await clients[0].get(f"/v1/sessions/{session}/messages")).json()["messages"]
        # each cancelled round left its stopped turn (the request, the call, its cancelled result)
        stopped = [m for m in history if m.get("stopped")]
        assert len(stopped) == 9 and {m["stopped"] for m in stopped} == {"cancel_requested"}
        answered = [m["content"] for m in history if not m.get("stopped")]
        assert answered == ["hello", "You said: hello"]
    finally:
        for client in clients:
            await client.aclose()


async def test_a_killed_worker_s_runs_end_worker_lost(start_cluster: StartCluster) -> None:
    # without resume (tests/scale/test_durable_runs.py has the resume)
    victim, survivor, other = start_cluster(3, {"AGENT_RESUME_RUNS": "0"})
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs, other.client() as co:
        slow = " ".join(["slow"] + ["w"] * 200)
        started = await cv.post(
            f"/v1/sessions/{session}/runs", json={"input": slow, "background": True}
        )
        assert started.status_code == 202
        run_id = started.json()["run_id"]
        followed: list[Event] = []
        killed_at = 0.0
        async with open_stream(cs, "GET", f"/v1/runs/{run_id}/events") as (response, stream):
            assert response.status_code == 200
            async for event in stream:
                followed.append(event)
                if len(followed) == 4:
                    victim.process.send_signal(signal.SIGKILL)
                    victim.process.wait(10)
                    killed_at = time.monotonic()
        ended_after = time.monotonic() - killed_at
        assert_well_formed(followed, run_id)
        terminal = followed[-1]
        assert terminal.type == "run.failed"
        assert terminal.data["data"]["error"]["code"] == "worker_lost"
        # the contract: within AGENT_LEASE_SECONDS (the lease lapses by 2/3 of it, the sweep
        # notices by 5/6); the margin is for a loaded machine and the client's own read
        assert ended_after < LEASE_SECONDS + 1.0, ended_after
        print(f"worker_lost {ended_after:.2f} s after the kill (lease {LEASE_SECONDS} s)")
        # a reader resuming on the third worker gets exactly the end
        rest, _ = await read_events(
            co, "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(followed[-2].id)}
        )
        assert rest == [terminal]
        view = await run_view(co, run_id)
        assert view["status"] == "failed" and view["error"]["code"] == "worker_lost"
        # the session is usable again, from any worker
        summary = (await cs.get(f"/v1/sessions/{session}")).json()
        assert summary["active_run_id"] is None
        again = await co.post(f"/v1/sessions/{session}/runs", json={"input": "hi", "stream": False})
        assert again.status_code == 200, again.text
        assert again.json()["output"] == {"content": "You said: hi"}


async def test_workers_start_together_on_a_fresh_database(start_cluster: StartCluster) -> None:
    """Five processes migrate one empty schema at once, then serve one another's runs."""
    servers: list[Server] = start_cluster(5)
    async with servers[0].client() as first, servers[4].client() as last:
        answer = await first.post(
            f"/v1/sessions/{new_session()}/runs", json={"input": "x", "stream": False}
        )
        assert answer.status_code == 200
        assert (await run_view(last, answer.json()["run_id"]))["status"] == "completed"
