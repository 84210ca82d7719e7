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

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from tests.e2e.conftest import Server, launch, wait_for
from tests.fakes.tcp_proxy import FaultyProxy

from .conftest import state

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _through(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    host = f"{netloc[0]}@127.0.0.1:{port}" if netloc[1] else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=host))


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Server, FaultyProxy, str, str]]:
    from tests.scale.services import POSTGRES_URL, create_schema, drop_schema

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
