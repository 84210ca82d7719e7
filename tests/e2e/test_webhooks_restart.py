"""The webhook outbox survives a crash: a real server killed while its receiver is down
delivers the message, once, after its restart."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sqlite3
from pathlib import Path

from tests.fakes.webhook_receiver import WebhookReceiver
from tests.support.server import Launch, free_port
from tests.support.waiting import wait_for

SECRET = "whsec_" + base64.b64encode(b"r" * 32).decode()
ENV = {
    "AGENT_WEBHOOK_SECRET": SECRET,
    "AGENT_WEBHOOK_ALLOW_PRIVATE": "1",
    "AGENT_WEBHOOK_BACKOFF": "0.2",
    "AGENT_WEBHOOK_BACKOFF_MAX": "0.5",
    "AGENT_WEBHOOK_POLL_INTERVAL": "0.1",
    "AGENT_WEBHOOK_MAX_ATTEMPTS": "100",
}


def _outbox(database: Path, run_id: str) -> tuple[str | None, int]:
    """The run's message state and its attempts, read from the server's database."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT state, attempts FROM webhook_outbox WHERE run_id = ?", (run_id,)
        ).fetchone()
    return (None, 0) if row is None else (row[0], row[1])


async def _wait_outbox(database: Path, run_id: str, state: str, attempts: int) -> None:
    async def reached() -> bool:
        found, made = await asyncio.to_thread(_outbox, database, run_id)
        return found == state and made >= attempts

    await wait_for(reached, within=30)


async def test_outbox_survives_a_kill_and_delivers_once(
    start_server: Launch, tmp_path: Path
) -> None:
    directory = tmp_path / "server"
    port = free_port()  # the receiver's, nothing listening on it yet
    url = f"http://127.0.0.1:{port}/hooks"
    server = start_server(ENV, directory=directory)
    async with server.client() as client:
        response = await client.post(
            "/v1/sessions/hooked/runs",
            json={"input": "hello", "stream": False, "webhook_url": url},
        )
        assert response.status_code == 200, response.text
        run_id = response.json()["run_id"]
    database = directory / "var" / "agent.db"
    # the receiver is down: attempts fail (connection refused) and the message stays pending
    await _wait_outbox(database, run_id, "pending", 2)
    os.killpg(server.process.pid, signal.SIGKILL)
    server.wait(10)
    _, attempts_before = _outbox(database, run_id)

    receiver = await WebhookReceiver(SECRET).start(port)
    try:
        restarted = start_server(ENV, directory=directory)
        await receiver.wait_for(lambda r: len(r.deliveries) == 1, within=30)
        await _wait_outbox(database, run_id, "delivered", attempts_before + 1)
        restarted.stop()
        (request,) = receiver.requests  # once
        assert request.verified
        body = request.json()
        assert body["type"] == "run.completed"
        assert body["data"]["run_id"] == run_id
        assert body["data"]["output"]["content"] == "You said: hello"
    finally:
        await receiver.aclose()


async def test_a_run_lost_with_its_server_notifies_its_webhook(
    start_server: Launch, tmp_path: Path
) -> None:
    # killed mid-run, and not resumed at the restart: the restarted server ends the run
    # (worker_lost) and sends the notification its first life never could
    env = {**ENV, "AGENT_RESUME_RUNS": "0", "AGENT_DEMO_SLOW_SECONDS": "60"}
    directory = tmp_path / "server"
    port = free_port()
    receiver = await WebhookReceiver(SECRET).start(port)
    try:
        server = start_server(env, directory=directory)
        async with server.client() as client:
            response = await client.post(
                "/v1/sessions/lost/runs",
                json={
                    "input": "a slow answer, please",
                    "background": True,
                    "webhook_url": f"http://127.0.0.1:{port}/hooks",
                },
            )
            assert response.status_code == 202, response.text
            run_id = response.json()["run_id"]

            async def running() -> bool:
                answer = await client.get(f"/v1/runs/{run_id}")
                return bool(answer.json()["status"] == "running")

            await wait_for(running, within=30)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.wait(10)
        assert receiver.requests == []

        restarted = start_server(env, directory=directory)
        await receiver.wait_for(lambda r: len(r.deliveries) == 1, within=30)
        (request,) = receiver.requests
        assert request.verified
        body = request.json()
        assert body["type"] == "run.failed"
        assert body["data"]["run_id"] == run_id
        assert body["data"]["error"]["code"] == "worker_lost"
        async with restarted.client() as client:
            record = (await client.get(f"/v1/runs/{run_id}")).json()
        assert record["status"] == "failed" and record["error"]["code"] == "worker_lost"
        restarted.stop()
    finally:
        await receiver.aclose()
