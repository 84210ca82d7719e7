"""The LangGraph API's authorization: bob, with his own key, thread and run, names alice's
thread, run and interrupt every way the API lets a request name them.

Each attempt gets the same 404 an id that never existed gets (bar the id in the text), and his
own thread with her run id is no better. Afterwards her interrupt still waits and her own
answer still gets through. On one worker, and on two server processes sharing Redis and
PostgreSQL (her objects made through the first, his attempts sent to the second): the
``layout`` fixture of tests/reliability/conftest.py.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from langgraph_sdk import get_client

from tests.support.auth import KEYS, auth
from tests.support.authz import Layout


def _human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def _masked(answer: httpx.Response, *ids: str) -> tuple[int, str]:
    text = answer.text
    for id_ in ids:
        text = text.replace(id_, "<id>")
    return answer.status_code, re.sub(r"[0-9a-f-]{36}|run_[0-9a-f]{32}", "<id>", text)


async def test_bob_cannot_reach_alices_thread_run_or_interrupt(layout: Layout) -> None:
    alice = get_client(url=f"{layout.owner.base_url}/langgraph", api_key=KEYS["alice"])
    try:
        thread: Any = await alice.threads.create(metadata={"owner": "alice"})
        tid = thread["thread_id"]
        done: Any = await alice.runs.create(tid, "default", input=_human("hello"))
        await alice.runs.join(tid, done["run_id"])
        asked = [
            p
            async for p in alice.runs.stream(
                tid, "default", input=_human("delete secret.txt"), stream_mode="updates"
            )
        ]
        waiting = str(asked[0].data["run_id"])
        interrupt = next(p.data["__interrupt__"][0] for p in asked if "__interrupt__" in p.data)
        checkpoint = (await alice.threads.get_history(tid))[-1]["checkpoint"]["checkpoint_id"]

        async with httpx.AsyncClient(
            base_url=f"{layout.other.base_url}/langgraph", headers=auth("bob"), timeout=15
        ) as bob:
            own: Any = (await bob.post("/threads", json={})).json()
            mine = own["thread_id"]
            ghost, ghost_run = str(uuid.uuid4()), f"run_{uuid.uuid4().hex}"
            body = {"assistant_id": "default", "input": _human("mine now")}
            resume = {"assistant_id": "default", "command": {"resume": [{"type": "accept"}]}}
            fork = {**body, "checkpoint_id": checkpoint}

            # (method, path on alice's objects, the same path on ids that never existed, body)
            attempts: list[tuple[str, str, str, dict[str, Any] | None]] = [
                ("GET", f"/threads/{tid}", f"/threads/{ghost}", None),
                ("PATCH", f"/threads/{tid}", f"/threads/{ghost}", {"metadata": {"x": 1}}),
                ("DELETE", f"/threads/{tid}", f"/threads/{ghost}", None),
                ("GET", f"/threads/{tid}/state", f"/threads/{ghost}/state", None),
                (
                    "GET",
                    f"/threads/{tid}/state/{checkpoint}",
                    f"/threads/{ghost}/state/{checkpoint}",
                    None,
                ),
                ("POST", f"/threads/{tid}/history", f"/threads/{ghost}/history", {}),
                ("POST", f"/threads/{tid}/copy", f"/threads/{ghost}/copy", None),
                ("GET", f"/threads/{tid}/runs", f"/threads/{ghost}/runs", None),
                (
                    "GET",
                    f"/threads/{tid}/runs/{waiting}",
                    f"/threads/{ghost}/runs/{ghost_run}",
                    None,
                ),
                ("POST", f"/threads/{tid}/runs/wait", f"/threads/{ghost}/runs/wait", body),
                ("POST", f"/threads/{tid}/runs/wait", f"/threads/{ghost}/runs/wait", resume),
                ("POST", f"/threads/{tid}/runs/wait", f"/threads/{ghost}/runs/wait", fork),
                ("POST", f"/threads/{tid}/runs/stream", f"/threads/{ghost}/runs/stream", body),
                ("POST", f"/threads/{tid}/runs", f"/threads/{ghost}/runs", body),
                (
                    "GET",
                    f"/threads/{tid}/runs/{waiting}/join",
                    f"/threads/{ghost}/runs/{ghost_run}/join",
                    None,
                ),
                (
                    "GET",
                    f"/threads/{tid}/runs/{waiting}/stream",
                    f"/threads/{ghost}/runs/{ghost_run}/stream",
                    None,
                ),
                (
                    "POST",
                    f"/threads/{tid}/runs/{waiting}/cancel",
                    f"/threads/{ghost}/runs/{ghost_run}/cancel",
                    None,
                ),
                # his own thread, her run
                (
                    "GET",
                    f"/threads/{mine}/runs/{waiting}",
                    f"/threads/{mine}/runs/{ghost_run}",
                    None,
                ),
                (
                    "GET",
                    f"/threads/{mine}/runs/{waiting}/join",
                    f"/threads/{mine}/runs/{ghost_run}/join",
                    None,
                ),
                (
                    "POST",
                    f"/threads/{mine}/runs/{waiting}/cancel",
                    f"/threads/{mine}/runs/{ghost_run}/cancel",
                    None,
                ),
            ]
            send: Callable[..., Awaitable[httpx.Response]] = bob.request
            for method, path, unknown, payload in attempts:
                theirs = await send(method, path, json=payload)
                nothing = await send(method, unknown, json=payload)
                assert theirs.status_code == 404, (method, path, theirs.text)
                assert _masked(theirs, tid, waiting) == _masked(nothing, ghost, ghost_run), path
            # his own thread answering her interrupt: nothing waits there
            refused = await bob.post(f"/threads/{mine}/runs/wait", json=resume)
            assert refused.status_code == 409, refused.text
            found = await bob.post("/threads/search", json={"metadata": {"owner": "alice"}})
            assert found.json() == []

        # her interrupt still waits, and her own answer gets through
        state: Any = await alice.threads.get_state(tid)
        assert state["tasks"][0]["interrupts"][0]["id"] == interrupt["id"]
        result: Any = await alice.runs.wait(
            tid, "default", command={"resume": [{"type": "accept", "args": None}]}
        )
        assert "Deleted secret.txt" in result["messages"][-1]["content"]
    finally:
        await alice.aclose()
