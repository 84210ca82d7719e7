"""Token budgets across two worker processes sharing Redis: runs racing for the last of a
budget on both workers at once are never admitted beyond it."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.support.cluster import StartCluster
from tests.support.waiting import wait_for

RESERVE = 10
BUDGET = 35  # room for three reservations of 10, not four


async def test_runs_racing_on_two_workers_never_pass_the_budget(
    start_cluster: StartCluster,
) -> None:
    env = {
        "AGENT_BUDGETS": f"principal:*={BUDGET}",
        "AGENT_BUDGET_RESERVE_TOKENS": str(RESERVE),
        # long runs: every admitted one still holds its reservation while the others race
        "AGENT_DEMO_SLOW_SECONDS": "1",
    }
    one, two = start_cluster(2, env)
    async with one.client() as c1, two.client() as c2:
        clients = [c1, c2]

        async def start(index: int) -> httpx.Response:
            return await clients[index % 2].post(
                f"/v1/sessions/budget-{uuid.uuid4().hex[:10]}/runs",
                json={"input": "slow " + " ".join(["w"] * 60), "background": True},
            )

        answers = await asyncio.gather(*(start(i) for i in range(16)))
        admitted = [a for a in answers if a.status_code == 202]
        refused = [a for a in answers if a.status_code != 202]
        assert len(admitted) == BUDGET // RESERVE, [a.text for a in refused][:3]
        for answer in refused:
            assert answer.status_code == 429, answer.text
            assert answer.json()["code"] == "budget_exceeded"
            assert int(answer.headers["retry-after"]) >= 1
        # cancelled, the admitted runs settle their reservations to what they used
        run_ids = [a.json()["run_id"] for a in admitted]
        for run_id in run_ids:
            assert (await c1.post(f"/v1/runs/{run_id}/cancel")).status_code in (200, 202)

        async def finished() -> bool:
            views = [(await c2.get(f"/v1/runs/{run_id}")).json() for run_id in run_ids]
            return all(view["status"] == "cancelled" for view in views)

        await wait_for(finished, within=30)
        # their reservations went back: a new run fits again
        answer = await start(0)
        assert answer.status_code == 202, answer.text
        await c1.post(f"/v1/runs/{answer.json()['run_id']}/cancel")
