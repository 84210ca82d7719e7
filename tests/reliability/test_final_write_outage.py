"""A PostgreSQL outage while runs end (one worker, no Redis): their outcomes still get stored.

The server reaches PostgreSQL through a loopback proxy (``tests.fakes.tcp_proxy``). A
streamed run is cut off from the database after its first words: the proxy refuses (a
stopped server), then black-holes (a dead path), then restores. The run's readers get its
terminal event during the outage; once PostgreSQL is back the stored record reaches the real
outcome (``completed``, its turn stored once), the session's lock is free again and the next
run of the session builds on the stored turn. Before the final write was retried the record
stayed ``running`` for good and became ``worker_lost`` at the next start.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from tests.fakes.tcp_proxy import FaultyProxy
from tests.support.probes import state
from tests.support.server import Server, launch
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

_ENDS = ("run.completed", "run.failed", "run.cancelled")


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    host = f"{netloc[0]}@127.0.0.1:{port}" if netloc[1] else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=host))


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Server, FaultyProxy, str, str]]:
    from tests.support.services import POSTGRES_URL, create_schema, drop_schema

    url, schema = create_schema()
    try:
        with FaultyProxy(urlsplit(POSTGRES_URL).port or 5432) as proxy:
            server = launch(
                tmp_path,
                {
                    "AGENT_DATABASE_URL": _through(url, proxy.port),
                    "AGENT_BACKEND_TIMEOUT": "1",
                    "AGENT_DEMO_SLOW_SECONDS": "0.05",
                },
            )
            try:
                yield server, proxy, POSTGRES_URL, schema
            finally:
                proxy.restore()
                server.stop()
    finally:
        drop_schema(schema)


async def _stored(url: str, schema: str, run_id: str) -> tuple[str, int]:
    connection = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        row = await connection.fetchrow("SELECT status FROM runs WHERE run_id = $1", run_id)
        turn = await connection.fetchval("SELECT count(*) FROM messages WHERE run_id = $1", run_id)
    finally:
        await connection.close()
    assert row is not None
    return str(row["status"]), int(turn)


async def test_a_run_ended_during_an_outage_stores_its_real_outcome(
    outage: tuple[Server, FaultyProxy, str, str],
) -> None:
    server, proxy, url, schema = outage
    words = " ".join(f"w{i}" for i in range(40))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        events: list[tuple[str, dict[str, Any]]] = []
        async with client.stream(
            "POST", "/v1/sessions/out/runs", json={"input": f"slow {words}"}
        ) as response:
            assert response.status_code == 200
            kind = ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    kind = line.removeprefix("event:").strip()
                elif line.startswith("data:"):
                    events.append((kind, json.loads(line.removeprefix("data:"))))
                    if kind == "text.delta" and proxy.mode == "forward":
                        proxy.refuse()  # its record is stored; its end will not be, now
        run_id = events[0][1]["run_id"]
        assert events[-1][0] == "run.completed", events[-1]
        assert (await client.get(f"/v1/runs/{run_id}")).status_code == 503
        assert (await state(client))["unwritten_ends"] == 1
        proxy.blackhole()
        assert await _stored(url, schema, run_id) == ("running", 0)  # behind the proxy's back

        proxy.restore()

        async def stored() -> bool:
            return bool((await state(client))["unwritten_ends"] == 0)

        restored = time.monotonic()
        await wait_for(stored, within=30)
        print(f"the run's end was stored {time.monotonic() - restored:.2f} s after the restore")
        assert await _stored(url, schema, run_id) == ("completed", 2)
        view = (await client.get(f"/v1/runs/{run_id}")).json()
        assert view["status"] == "completed" and view["usage"]["output_tokens"] > 0
        # the session is free and its next turn follows the stored one
        nxt = await client.post("/v1/sessions/out/runs", json={"input": "next", "stream": False})
        assert nxt.status_code == 200, nxt.text
        body = (await client.get("/v1/sessions/out/messages")).json()
        assert [r["run_id"] for r in body["runs"]] == [run_id, nxt.json()["run_id"]]
    assert "could not store the run's end" in server.log()
    assert "stored the end of a run after" in server.log()


async def _runs(url: str, schema: str, run_ids: list[str]) -> dict[str, tuple[str, Any]]:
    connection = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        rows = await connection.fetch(
            "SELECT run_id, status, error FROM runs WHERE run_id = ANY($1::text[])", run_ids
        )
    finally:
        await connection.close()
    return {row["run_id"]: (str(row["status"]), row["error"]) for row in rows}


async def test_twelve_runs_through_an_outage_none_ends_internal(
    outage: tuple[Server, FaultyProxy, str, str],
) -> None:
    server, proxy, url, schema = outage
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        run_ids: list[str] = []
        for index in range(12):
            # streaming runs, and runs that call a tool (its start is recorded first)
            text = "slow " + " ".join(f"w{i}" for i in range(30))
            if index % 3 == 2:
                text = "what time is it"
            started = await client.post(
                f"/v1/sessions/out-{index}/runs", json={"input": text, "background": True}
            )
            assert started.status_code == 202, started.text
            run_ids.append(started.json()["run_id"])
        ends: dict[str, dict[str, Any]] = {}
        reading = [asyncio.Event() for _ in run_ids]

        async def follow(run_id: str, began: asyncio.Event) -> None:
            async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                assert response.status_code == 200
                began.set()
                kind = ""
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        kind = line.removeprefix("event:").strip()
                    elif line.startswith("data:") and kind in _ENDS:
                        ends[run_id] = {"type": kind, **json.loads(line.removeprefix("data:"))}

        readers = [
            asyncio.ensure_future(follow(r, e)) for r, e in zip(run_ids, reading, strict=True)
        ]
        for began in reading:
            await began.wait()
        proxy.refuse()  # mid-run for every one of them
        # every run ends for its readers meanwhile; none internal
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        assert len(ends) == 12
        for end in ends.values():
            assert end["type"] == "run.completed" or (
                end["type"] == "run.failed" and end["data"]["error"]["code"] == "unavailable"
            ), end
        proxy.blackhole()
        proxy.restore()

        async def stored() -> bool:
            return bool((await state(client))["unwritten_ends"] == 0)

        await wait_for(stored, within=60)
        records = await _runs(url, schema, run_ids)
        assert len(records) == 12
        for run_id, (status, error) in records.items():
            assert status == ends[run_id]["type"].removeprefix("run."), (run_id, status, error)
            assert error is None or json.loads(error)["code"] != "internal", error
        print(
            "ends through the outage:",
            sorted(
                e["type"] + ":" + e["data"].get("error", {}).get("code", "") for e in ends.values()
            ),
        )
