"""A protocol's run start with files, refused after its files were stored: nothing is kept.

A data URL is stored as a file before the run starts (the intake takes the input whole before
anything runs); a start then refused (a busy session) deletes what it stored, on every
protocol path, each answering in its own shape.
"""

from __future__ import annotations

import base64
from typing import Any

from app.storage import Store
from tests.support import files as samples
from tests.support.served import Serve, Served
from tests.support.waiting import wait_for

PNG_URL = "data:image/png;base64," + base64.b64encode(samples.png(seed=42)).decode()


def _image_for(path: str) -> dict[str, Any]:
    """A request to ``path`` in session ``busy`` that carries the image."""
    if path == "/openai/v1/responses":
        content: list[dict[str, Any]] = [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
        ]
        return {
            "model": "default",
            "conversation": "busy",
            "input": [{"role": "user", "content": content}],
        }
    if path.endswith("/ag-ui"):
        source = {"type": "url", "value": PNG_URL}
        parts: list[dict[str, Any]] = [
            {"type": "text", "text": "look"},
            {"type": "image", "source": source},
        ]
        return {
            "threadId": "busy",
            "runId": "r",
            "messages": [{"id": "u", "role": "user", "content": parts}],
        }
    files = [
        {"type": "text", "text": "look"},
        {"type": "file", "mediaType": "image/png", "url": PNG_URL},
    ]
    return {"id": "busy", "messages": [{"id": "u", "role": "user", "parts": files}]}


async def _blobs(served: Served) -> int:
    store: Store = served.services.store
    return await store.count_file_blobs()


async def test_a_refused_start_keeps_none_of_its_files(serve: Serve) -> None:
    async with serve(demo_slow_seconds=5.0) as served:
        client = served.client
        held = await client.post(
            "/v1/sessions/busy/runs", json={"input": "slow a b c", "background": True}
        )
        assert held.status_code == 202, held.text
        run_id = held.json()["run_id"]

        async def running() -> bool | None:
            status = (await client.get(f"/v1/runs/{run_id}")).json()["status"]
            return True if status == "running" else None

        await wait_for(running)
        before = await _blobs(served)
        responses = await client.post(
            "/openai/v1/responses", json=_image_for("/openai/v1/responses")
        )
        assert responses.status_code == 409, responses.text
        assert responses.json()["error"]["code"] == "session_busy"
        agui = await client.post("/v1/agents/default/ag-ui", json=_image_for("/ag-ui"))
        assert agui.status_code == 200
        assert '"type":"RUN_ERROR"' in agui.text and '"code":"session_busy"' in agui.text
        chat = await client.post("/v1/agents/default/ai-sdk/chat", json=_image_for("/chat"))
        assert (chat.status_code, chat.json()["code"]) == (409, "session_busy")
        # each stored the image, and deleted it again when its start was refused
        assert await _blobs(served) == before
        await client.post(f"/v1/runs/{run_id}/cancel")
        await served.wait_idle()
