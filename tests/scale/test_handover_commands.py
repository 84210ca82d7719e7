"""Commands sent while a run is between workers: its worker was just killed (SIGKILL), and the
other has not taken its lease yet.

An answer in that window is refused with 503 and ``Retry-After`` (post it again), never a 409 a
front end would take as final; posted again, it is taken once the run is resumed, and the tool
runs once. A cancel in that window answered 202 always ends the run ``run.cancelled``: the
cancel is kept for whoever takes the run next (``app.runs.cancel_marks``), whether that worker
resumes it or, unable to, ends it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.cluster import StartCluster
from tests.support.runs import (
    SLOW,
    events_so_far,
    follow,
    kill,
    new_session,
    resumed,
    start_background,
)
from tests.support.sse import Event, assert_well_formed
from tests.support.waiting import wait_for


def confirmation_request(events: list[Event]) -> dict[str, Any] | None:
    for event in events:
        if event.type == "custom" and event.data["data"]["name"] == "confirmation_requested":
            payload: dict[str, Any] = event.data["data"]["payload"]
            return payload
    return None


async def test_an_answer_right_after_the_kill_is_retried_not_refused(
    start_cluster: StartCluster,
) -> None:
    victim, survivor = start_cluster(2)
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs:
        run_id = await start_background(cv, session, "delete plans.md")

        async def asked() -> dict[str, Any] | None:
            return confirmation_request(await events_so_far(cs, run_id))

        payload = await wait_for(asked)
        kill(victim)
        answer = {
            "session_id": session,
            "run_id": run_id,
            "name": payload["response_event"],
            "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
        }
        refusals: list[httpx.Response] = []

        async def taken() -> bool:
            response = await cs.post("/external-events", json=answer)
            if response.status_code == 503:
                refusals.append(response)
                return False
            assert response.status_code == 202, response.text
            return True

        await wait_for(taken, within=30)
        # the lease (2 s here) outlives the kill: the first answers came between owners
        assert refusals, "the answer was taken before the run could have been resumed"
        for refused in refusals:
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert refused.json()["code"] == "unavailable"
            assert float(refused.headers["retry-after"]) > 0
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        (marker,) = resumed(events)
        assert marker.data["data"]["reason"] == "worker_lost"
        assert events[-1].type == "run.completed"
        assert "Deleted plans.md" in events[-1].data["data"]["output"]["content"]
        tool_ends = [e for e in events if e.type == "tool.call.completed"]
        assert len(tool_ends) == 1  # the approved call ran once
        # a second answer to the same call is stale: 409, as for any answered call
        again = await cs.post("/external-events", json=answer)
        assert again.status_code == 409, again.text


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        pytest.param({}, "streaming", id="resumed-streaming"),
        pytest.param({}, "waiting", id="resumed-waiting"),
        # no resume: the sweep ends the run, cancelled rather than worker_lost
        pytest.param({"AGENT_RESUME_RUNS": "false"}, "streaming", id="swept-streaming"),
    ],
)
async def test_a_cancel_right_after_the_kill_ends_the_run_cancelled(
    start_cluster: StartCluster, env: dict[str, str], kind: str
) -> None:
    victim, survivor = start_cluster(2, env)
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs:
        if kind == "streaming":
            run_id = await start_background(cv, session, SLOW)

            async def streaming() -> bool:
                return len(await events_so_far(cs, run_id)) >= 3

            await wait_for(streaming)
        else:
            run_id = await start_background(cv, session, "delete plans.md")

            async def asked() -> dict[str, Any] | None:
                return confirmation_request(await events_so_far(cs, run_id))

            await wait_for(asked)
        kill(victim)
        cancel = await cs.post(f"/v1/runs/{run_id}/cancel")
        assert cancel.status_code in (200, 202), cancel.text
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        assert events[-1].type == "run.cancelled", events[-1]
        assert events[-1].data["data"]["reason"] == "cancel_requested"

        async def stored() -> bool:
            view = (await cs.get(f"/v1/runs/{run_id}")).json()
            return bool(view["status"] == "cancelled")

        await wait_for(stored)
        messages = (await cs.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        # what is kept of the turn is marked as stopped by the cancel, never a finished answer
        assert all(m.get("stopped") == "cancel_requested" for m in messages), messages
