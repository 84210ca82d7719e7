"""A rolling deploy of two workers loses no run that waits for a person's approval.

Two workers share Redis and PostgreSQL. 200 runs wait for an approval, half started on each;
a reader follows every run the way a browser does, reconnecting with ``Last-Event-ID`` to a
live worker whenever its stream is cut. Worker A is stopped (SIGTERM) and started again, then
worker B; each stop parks its waiting runs and the other worker takes them over. Then every
run is approved, through either worker: every run completes, every approved tool ran exactly
once, and every reader got one unbroken stream ending in its terminal event.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from tests.support.cluster import StartCluster
from tests.support.runs import approve, is_request, new_session, resumed, start_background
from tests.support.server import Server
from tests.support.sse import TERMINAL, Event, assert_well_formed, open_stream
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RUNS = 200


def _config(directory: Path) -> Path:
    config = directory / "agents.toml"
    config.write_text(
        "[agents.default]\n"
        'model = "python:tests.fakes.config_models:tool_caller"\n'
        'tools = ["tests.fakes.durable_tools:once_effect"]\n'
        "\n"
        "[agents.default.policies]\n"
        'once_effect = "ask"\n',
        encoding="utf-8",
    )
    return config


class Readers:
    """One reader per run, each on whichever worker is up; the confirmation each saw."""

    def __init__(self, alive: list[Server]) -> None:
        self.alive = alive
        self.asked: dict[str, asyncio.Future[Event]] = {}
        self.reconnects = 0

    async def follow(self, run_id: str, turn: int) -> list[Event]:
        asked = self.asked[run_id]
        events: list[Event] = []
        while True:
            server = self.alive[turn % len(self.alive)]
            turn += 1
            headers = {"Last-Event-ID": str(events[-1].id)} if events else {}
            try:
                async with (
                    server.client() as client,
                    open_stream(client, "GET", f"/v1/runs/{run_id}/events", headers=headers) as (
                        response,
                        stream,
                    ),
                ):
                    if response.status_code == 200:
                        async for event in stream:
                            events.append(event)
                            if is_request(event) and not asked.done():
                                asked.set_result(event)
                            if event.type in TERMINAL:
                                return events
            except httpx.HTTPError:
                pass  # its worker stopped: read on from another, after the last event seen
            self.reconnects += 1
            await asyncio.sleep(0.05)


async def _resumed_total(server: Server) -> float:
    """The worker's ``agent_runs_resumed_total`` (every reason)."""
    async with server.client() as client:
        text = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("agent_runs_resumed_total{")
    )


async def test_a_rolling_restart_loses_no_waiting_run(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    effects.touch()
    env = {
        "AGENT_CONFIG": str(_config(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "DURABLE_EFFECTS": str(effects),
        # every waiting run holds a slot: room for all of them on either worker
        "AGENT_MAX_CONCURRENT_RUNS": str(2 * RUNS),
        "AGENT_DRAIN_TIMEOUT": "5",
    }
    a, b = start_cluster(2, env)
    alive = [a, b]
    readers = Readers(alive)
    runs: list[str] = []
    async with a.client() as ca, b.client() as cb:
        for index in range(RUNS):
            client = ca if index % 2 == 0 else cb
            runs.append(
                await start_background(
                    client, new_session(), f'call once_effect {{"text": "r{index}"}}'
                )
            )
    loop = asyncio.get_running_loop()
    readers.asked = {run_id: loop.create_future() for run_id in runs}
    follows = [
        asyncio.create_task(readers.follow(run_id, index)) for index, run_id in enumerate(runs)
    ]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(readers.asked[run_id] for run_id in runs)), timeout=120
        )

        async def roll(leaving: Server, taker: Server, count: int) -> Server:
            alive.remove(leaving)
            leaving.signal(signal.SIGTERM)
            assert await asyncio.to_thread(leaving.wait, 30) == 0

            # the other worker takes every parked run over (its sweep, lease by lease)
            async def taken() -> bool:
                return await _resumed_total(taker) >= count

            await wait_for(taken, within=120)
            (again,) = await asyncio.to_thread(start_cluster, 1, env)
            alive.append(again)
            return again

        a = await roll(a, b, RUNS // 2)
        # B now holds every run, its own and A's: stopping it hands all of them to the new A
        b = await roll(b, a, RUNS)
        for index, run_id in enumerate(runs):
            async with alive[index % 2].client() as client:
                answer = await approve(client, readers.asked[run_id].result())
            assert answer.status_code == 202, answer.text
        streams = await asyncio.wait_for(asyncio.gather(*follows), timeout=120)
    finally:
        for task in follows:
            task.cancel()
    for index, (run_id, events) in enumerate(zip(runs, streams, strict=True)):
        assert_well_formed(events, run_id)
        assert events[-1].type == "run.completed", events[-1]
        assert events[-1].data["data"]["output"]["content"] == f"once_effect -> recorded r{index}"
        # A's runs were handed over twice (A, then B), B's once
        assert 1 <= len(resumed(events)) <= 2
        assert {e.data["data"]["reason"] for e in resumed(events)} == {"shutdown"}
    # every stream was cut once or twice by a stop (A's readers, then B's) and read on
    assert readers.reconnects >= RUNS
    lines = effects.read_text(encoding="utf-8").splitlines()
    ran = sorted(line.split()[-1] for line in lines)
    assert ran == sorted(f"r{index}" for index in range(RUNS))  # each exactly once
