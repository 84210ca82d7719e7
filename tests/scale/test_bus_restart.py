"""Redis loses its state under a waiting run (``FLUSHALL``, or a restart without persistence):
the run is not failed; its worker notices its lease is gone and lets it go without an end,
an answer meanwhile is 503 with ``Retry-After``, and a sweep, which finds the run in the
store (Redis lists nothing any more), resumes it from its checkpoint on a fresh log whose seq
goes on from the checkpoint's; it asks again and takes its owner's answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.cluster import StartCluster, is_confirmation, new_session, run_view
from tests.support.services import RedisServer
from tests.support.sse import Event, open_stream
from tests.support.waiting import wait_for


async def _events(client: httpx.AsyncClient, run_id: str, after: int = 0) -> list[Event]:
    """The run's logged events after ``after`` now (the run goes on)."""
    events: list[Event] = []
    headers = {"Last-Event-ID": str(after)} if after else {}
    try:
        async with open_stream(client, "GET", f"/v1/runs/{run_id}/events", headers=headers) as (
            response,
            stream,
        ):
            if response.status_code != 200:
                return events
            async with asyncio.timeout(0.5):
                async for event in stream:
                    events.append(event)
    except TimeoutError:
        pass
    return events


async def _fenced(client: httpx.AsyncClient) -> float:
    """``agent_runs_fenced_total`` of one worker."""
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("agent_runs_fenced_total "):
            return float(line.split()[1])
    return 0.0


@pytest.mark.parametrize(
    ("how", "answer_at_once"),
    [("flushall", False), ("restart", False), ("flushall", True)],
    ids=["flushall", "restart", "flushall-answered-at-once"],
)
async def test_a_waiting_run_outlives_redis_restarted_empty(
    tmp_path: Path,
    start_cluster: StartCluster,
    cluster_env: dict[str, str],
    how: str,
    answer_at_once: bool,
) -> None:
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    try:
        # a counter that has issued many tokens: the store keeps the run's and its session's,
        # and refuses any lower one, so Redis's new counter must begin above them
        client = redis.Redis.from_url(redis_server.url)
        try:
            client.set(f"{cluster_env['AGENT_REDIS_PREFIX']}fence", 1_000_000)
        finally:
            client.close()
        holder, other = await asyncio.to_thread(
            start_cluster, 2, {"AGENT_REDIS_URL": redis_server.url}
        )
        async with holder.client() as ch, other.client() as co:
            session = new_session()
            started = await ch.post(
                f"/v1/sessions/{session}/runs",
                json={"input": "delete plans.md", "background": True},
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]

            async def asked() -> Event | None:
                if (await run_view(co, run_id))["status"] != "waiting":
                    return None
                return next((e for e in await _events(co, run_id) if is_confirmation(e)), None)

            question = await wait_for(asked)
            payload = question.data["data"]["payload"]
            answer: dict[str, Any] = {
                "session_id": session,
                "run_id": run_id,
                "name": payload["response_event"],
                "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
            }

            if how == "flushall":
                client = redis.Redis.from_url(redis_server.url)
                try:
                    client.flushall()
                finally:
                    client.close()
            else:
                redis_server.stop()
                redis_server.start()

            # the holder finds its lease gone at its next renewal and lets the run go without
            # an end. An answer before that (at once) is not taken by the holder, whose lease
            # Redis no longer names: 503 until the run is resumed, or taken by the run resumed
            # for it, never accepted by the holder and lost with the run's hand-over
            async def let_go() -> bool:
                return await _fenced(ch) >= 1

            if not answer_at_once:
                await wait_for(let_go, within=10)
            # from here until the run, resumed from its checkpoint (found in the store's
            # unfinished runs: Redis lists nothing), asks again, an answer is 503 with
            # Retry-After on either worker; then it is taken. Never accepted and then lost,
            # never a failed run
            statuses: list[int] = []

            async def accepted() -> bool:
                for client in (ch, co):
                    response = await client.post("/external-events", json=answer)
                    statuses.append(response.status_code)
                    assert response.status_code in (202, 503), response.text
                    if response.status_code == 503:
                        assert float(response.headers["retry-after"]) > 0
                        assert response.json()["code"] in ("unavailable", "draining")
                    else:
                        return True
                return False

            await wait_for(accepted, within=30)

            async def completed() -> dict[str, Any] | None:
                view = await run_view(co, run_id)
                assert view["status"] not in ("failed", "cancelled"), view
                return view if view["status"] == "completed" else None

            await wait_for(completed, within=20)
            # the fresh log goes on from the checkpoint's seq: one run.resumed, one question
            # asked again, one end
            after = await _events(co, run_id)
            resumed = [e for e in after if e.type == "run.resumed"]
            assert len(resumed) == 1
            marker = resumed[0]
            assert marker.data["data"]["reason"] == "worker_lost"
            assert marker.id == marker.data["data"]["from_seq"] + 1
            # from the checkpoint taken as the question was asked (or a later one)
            assert marker.data["data"]["from_seq"] >= question.id - 1
            ids = [e.id for e in after]
            assert ids == list(range(ids[0], ids[0] + len(ids)))
            assert after[-1].type == "run.completed"
            assert "Deleted plans.md" in after[-1].data["data"]["output"]["content"], [
                (e.id, e.type, e.data["data"]) for e in after
            ]
            messages = (await co.get(f"/v1/sessions/{session}/messages")).json()["messages"]
            assert messages[0]["role"] == "user"
            assert messages[-1]["role"] == "assistant"
            # the session takes its next turn at once
            again = await ch.post(
                f"/v1/sessions/{session}/runs", json={"input": "hi", "stream": False}
            )
            assert again.status_code == 200, again.text
            assert again.json()["status"] == "completed"
    finally:
        redis_server.stop()
