"""Redis or PostgreSQL unreachable: at start the server refuses to run (one clear line,
exit status 2); while serving, runs in flight are not failed (a Redis outage lets them go to
be resumed from their checkpoints, a PostgreSQL one keeps their ends in memory), requests get
503 ``unavailable`` without hanging, and the service resumes once the backend is back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.cluster import StartCluster, is_confirmation, new_session, read_until, run_view
from tests.support.server import AGENT_SERVER
from tests.support.services import POSTGRES_URL, RedisServer, free_port
from tests.support.sse import Event, open_stream
from tests.support.storage import TcpProxy, with_port
from tests.support.waiting import wait_for


def start_alone(env: dict[str, str], directory: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    environment.update(env)
    return subprocess.run(
        [str(AGENT_SERVER), "--port", str(free_port())],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AGENT_REDIS_URL": "redis://:s3cret@127.0.0.1:{port}/0"}, "Redis at redis://:***@"),
        (
            {"AGENT_DATABASE_URL": "postgresql://postgres:s3cret@127.0.0.1:{port}/test"},
            "cannot connect to PostgreSQL at postgresql://postgres:***@",
        ),
    ],
    ids=["redis", "postgres"],
)
def test_an_unreachable_backend_at_start_is_one_clear_line(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    closed = free_port()  # nothing listens there
    started = time.monotonic()
    result = start_alone({k: v.format(port=closed) for k, v in env.items()}, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agent-server: cannot start: ")
    assert expected in lines[0] and "s3cret" not in lines[0]
    assert time.monotonic() - started < 30


async def stream_in_task(
    client: httpx.AsyncClient, session: str, text: str
) -> tuple[asyncio.Future[None], list[Event], list[BaseException], asyncio.Event]:
    """A streamed run read in a task: (task, events so far, its error if any, started)."""
    events: list[Event] = []
    errors: list[BaseException] = []
    started = asyncio.Event()

    async def read() -> None:
        try:
            async with open_stream(
                client,
                "POST",
                f"/v1/sessions/{session}/runs",
                json={"input": text, "on_disconnect": "continue"},
            ) as (response, stream):
                assert response.status_code == 200
                async for event in stream:
                    events.append(event)
                    if event.type == "text.delta":
                        started.set()
        except httpx.HTTPError as exc:  # the stream broke: that is the outage showing
            errors.append(exc)

    return asyncio.ensure_future(read()), events, errors, started


async def test_redis_lost_while_serving(tmp_path: Path, start_cluster: StartCluster) -> None:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    try:
        one, two = await asyncio.to_thread(start_cluster, 2, {"AGENT_REDIS_URL": redis_server.url})
        async with one.client() as c1, two.client() as c2:
            session = new_session()
            task, events, _, started = await stream_in_task(
                c1, session, " ".join(["slow"] + ["w"] * 100)
            )
            await asyncio.wait_for(started.wait(), 20)
            run_id = events[0].data["run_id"]

            redis_server.stop()

            # the run in flight is not failed: its worker lets it go without an end (its
            # stream is cut), and it is resumed from its checkpoint once Redis is back
            await asyncio.wait_for(task, 30)
            assert not events or events[-1].type != "run.completed"
            assert (await c2.get(f"/v1/runs/{run_id}")).json().get("status") != "failed"
            # new work is refused at once with 503, on every worker; nobody hangs
            for client in (c1, c2):
                began = time.monotonic()
                refused = await client.post(
                    f"/v1/sessions/{new_session()}/runs", json={"input": "x"}
                )
                assert refused.status_code == 503, refused.text
                assert refused.json()["code"] == "unavailable"
                assert refused.headers["retry-after"]
                assert time.monotonic() - began < 10
                assert (await client.get("/healthz")).status_code == 200

            # Redis is back (empty: no persistence): the service resumes on every worker
            redis_server.start()

            async def serving() -> bool:
                answer = await c2.post(
                    f"/v1/sessions/{new_session()}/runs", json={"input": "hi", "stream": False}
                )
                return answer.status_code == 200

            await wait_for(serving, within=20)

            # the run let go in the outage is resumed from its checkpoint (found in the store:
            # the new Redis lists nothing) and completes
            async def resumed() -> bool:
                view = await run_view(c2, run_id)
                assert view["status"] != "failed", view
                return bool(view["status"] == "completed")

            await wait_for(resumed, within=30)
            again = await c1.post(
                f"/v1/sessions/{session}/runs", json={"input": "hi", "stream": False}
            )
            assert again.status_code == 200, again.text
            # and routing between them: a confirmation asked on worker 1, answered on worker 2
            asked, confirm_id = await read_until(
                c1,
                f"/v1/sessions/{new_session()}/runs",
                is_confirmation,
                json={"input": "delete a.txt", "on_disconnect": "continue"},
            )
            payload = asked[-1].data["data"]["payload"]
            answer = {
                "session_id": asked[-1].data["session_id"],
                "run_id": confirm_id,
                "name": payload["response_event"],
                "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
            }

            async def accepted() -> bool:
                response = await c2.post("/external-events", json=answer)
                return response.status_code == 202

            await wait_for(accepted, within=15)

            async def completed() -> bool:
                return bool((await run_view(c2, confirm_id))["status"] == "completed")

            await wait_for(completed)
    finally:
        redis_server.stop()


async def test_postgres_lost_while_serving(
    start_cluster: StartCluster, cluster_env: dict[str, str]
) -> None:
    proxy = TcpProxy(urlsplit(POSTGRES_URL).port or 5432)
    await proxy.start()
    try:
        # the test's own schema, reached through a proxy the test can cut
        proxied = with_port(cluster_env["AGENT_DATABASE_URL"], proxy.port)
        (server,) = await asyncio.to_thread(start_cluster, 1, {"AGENT_DATABASE_URL": proxied})
        async with server.client() as client:
            session = new_session()
            task, events, errors, started = await stream_in_task(
                client, session, " ".join(["slow"] + ["w"] * 20)
            )
            await asyncio.wait_for(started.wait(), 20)
            run_id = events[0].data["run_id"]
            await proxy.cut()
            # the run in flight still ends for its reader: its end waits in memory for the store
            await asyncio.wait_for(task, 30)
            assert not errors
            assert events[-1].type == "run.completed", events[-1]
            # new work gets 503 at once; the process stays alive
            began = time.monotonic()
            refused = await client.post(f"/v1/sessions/{new_session()}/runs", json={"input": "x"})
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "unavailable"
            assert time.monotonic() - began < 10
            assert (await client.get("/healthz")).status_code == 200

            await proxy.start()  # PostgreSQL is back

            async def serving() -> bool:
                answer = await client.post(
                    f"/v1/sessions/{new_session()}/runs", json={"input": "hi", "stream": False}
                )
                return answer.status_code == 200

            await wait_for(serving, within=20)

            # the run's end, which the store missed, is written once it answers again
            async def settled() -> dict[str, Any] | None:
                view = await run_view(client, run_id)
                return view if view["status"] == "completed" else None

            view = await wait_for(settled, within=30)
            assert view["error"] is None
    finally:
        await proxy.cut()
