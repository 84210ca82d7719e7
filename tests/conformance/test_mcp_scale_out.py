"""A handshake-era host's ``notifications/cancelled`` reaches its call's run on another worker:
two servers share Redis and PostgreSQL, the call runs on one, the notification lands on the
other (as a second connection of the host may)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.server import Server, launch
from tests.support.services import shared_backend
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

LEGACY = {"Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": "2025-11-25"}


async def _run_of(server: Server, session_id: str) -> str:
    async with httpx.AsyncClient(base_url=server.base_url) as http:

        async def active() -> str | None:
            answer = await http.get(f"/v1/sessions/{session_id}")
            run_id = answer.json().get("active_run_id") if answer.status_code == 200 else None
            return run_id if isinstance(run_id, str) else None

        found: str = await wait_for(active, within=10)
        return found


async def _status(server: Server, run_id: str) -> str | None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        status = (await http.get(f"/v1/runs/{run_id}")).json()["status"]
    return status if status in ("completed", "failed", "cancelled") else None


async def test_the_notification_cancels_a_run_held_by_another_worker(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with shared_backend() as env:
        env = {**env, "AGENT_DEMO_SLOW_SECONDS": "0.5"}
        one = launch(tmp_path_factory.mktemp("mcp-one"), env)
        two = launch(tmp_path_factory.mktemp("mcp-two"), env)
        try:
            words = " ".join(f"w{i}" for i in range(40))
            arguments = {"input": f"slow {words}", "session_id": "mcp-scale"}
            call: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": 5,
                "method": "tools/call",
                "params": {
                    "name": "default",
                    "arguments": arguments,
                    "_meta": {"progressToken": 5},
                },
            }
            async with httpx.AsyncClient(timeout=30) as http:
                progressing = asyncio.get_running_loop().create_future()

                async def read() -> str:
                    lines = []
                    url = f"{one.base_url}/mcp"
                    async with http.stream("POST", url, json=call, headers=LEGACY) as answer:
                        async for line in answer.aiter_lines():
                            lines.append(line)
                            if "notifications/progress" in line and not progressing.done():
                                progressing.set_result(None)  # the call is being read
                    return "\n".join(lines)

                answer = asyncio.ensure_future(read())
                await asyncio.wait_for(progressing, 10)
                run_id = await _run_of(one, "mcp-scale")
                cancelled = {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 5},
                }
                posted = await http.post(f"{two.base_url}/mcp", json=cancelled, headers=LEGACY)
                assert posted.status_code == 202
                status = await wait_for(lambda: _status(two, run_id), within=10)
                assert status == "cancelled"
                assert '"status":"cancelled"' in await answer
        finally:
            one.stop()
            two.stop()
