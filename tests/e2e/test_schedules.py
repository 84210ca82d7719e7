"""Scheduled runs across three real server processes sharing PostgreSQL and Redis.

Every worker runs its scheduler; each due time must give exactly one run, also when one of
the workers is killed (SIGKILL) while the schedule fires. The runs are counted in the
database itself, by the schedule's metadata on each run.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.support.server import Server, backend_env, launch
from tests.support.waiting import wait_for

# three servers on the shared backends: the scale-out set, in the slow run
pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

_FAST = {
    "AGENT_SCHEDULER_POLL_INTERVAL": "0.05",
    "AGENT_SCHEDULER_LEASE_SECONDS": "2",
    "AGENT_SCHEDULER_MIN_INTERVAL": "1",  # the test's schedule fires every second
}


async def _view(client: httpx.AsyncClient, schedule_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/schedules/{schedule_id}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


async def _until_started(
    client: httpx.AsyncClient, schedule_id: str, count: int, within: float = 60.0
) -> dict[str, Any]:
    """The schedule once ``count`` of its firings started (polled, not slept on)."""

    async def started() -> dict[str, Any] | None:
        view = await _view(client, schedule_id)
        firings = [f for f in view["firings"] if f["status"] == "started"]
        return view if len(firings) >= count else None

    found: dict[str, Any] = await wait_for(started, within=within)
    return found


async def _runs_per_due_time(database_url: str, schedule_id: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT metadata->>'scheduled_for' AS due, count(*) AS runs FROM runs"
            " WHERE metadata->>'schedule_id' = $1 GROUP BY 1",
            schedule_id,
        )
    finally:
        await conn.close()
    return {row["due"]: row["runs"] for row in rows}


def _kill(server: Server) -> None:
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(10)


async def test_three_workers_one_run_per_due_time_and_one_killed(tmp_path: Path) -> None:
    with backend_env("redis+postgres") as shared:
        env = {**shared, **_FAST}
        # one after another: started together on a busy machine, one may miss the
        # start-up timeout
        servers: list[Server] = []
        try:
            for i in range(3):
                servers.append(await asyncio.to_thread(launch, tmp_path / f"worker-{i}", env))
            async with servers[1].client() as client:
                created = await client.post(
                    "/v1/schedules",
                    json={"input": "tick", "cron": "* * * * * *", "end_after": 6},
                )
                assert created.status_code == 201, created.text
                schedule_id = created.json()["schedule_id"]
                await _until_started(client, schedule_id, 2)
                _kill(servers[0])  # a worker dies while the schedule fires every second
                view = await _until_started(client, schedule_id, 6)
            assert view["next_due_at"] is None
            assert view["fired_count"] == 6
            dues = [f["due_at"] for f in view["firings"]]
            assert len(set(dues)) == 6
            assert len({f["run_id"] for f in view["firings"]}) == 6
            runs = await _runs_per_due_time(shared["AGENT_DATABASE_URL"], schedule_id)
            assert sorted(runs) == sorted(dues)
            assert set(runs.values()) == {1}
            fired_by = [s for s in servers[1:] if "scheduled run started" in s.log()]
            assert fired_by, "no surviving worker fired"
        finally:
            for server in servers:
                server.stop()
