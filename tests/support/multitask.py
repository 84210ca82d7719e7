"""The ``multitask_strategy`` scenarios, over real HTTP, for one worker (both clients on the
same server) or two (each client on its own worker, sharing Redis and PostgreSQL).

Every busy session here is held by a run waiting for a confirmation: it stays active until
the test answers, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from tests.support.sse import Event, assert_well_formed, read_events
from tests.support.waiting import wait_for


def new_session() -> str:
    return f"mt-{uuid.uuid4().hex[:12]}"


async def view(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def start_waiting(client: httpx.AsyncClient, session: str, name: str) -> str:
    """A background run in ``session`` that waits for the confirmation of ``delete NAME``."""
    started = await client.post(
        f"/v1/sessions/{session}/runs", json={"input": f"delete {name}", "background": True}
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]

    async def waiting() -> bool:
        return bool((await view(client, run_id))["status"] == "waiting")

    await wait_for(waiting)
    return run_id


async def events_of(client: httpx.AsyncClient, run_id: str) -> list[Event]:
    events, response = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    assert response.status_code == 200, response.text
    return events


async def _until_request(client: httpx.AsyncClient, run_id: str) -> str:
    from tests.support.sse import open_stream

    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (response, stream):
        assert response.status_code == 200
        async for event in stream:
            if event.type == "custom" and event.data["data"]["name"] == "confirmation_requested":
                call_id: str = event.data["data"]["payload"]["tool_call_id"]
                return call_id
    raise AssertionError("no confirmation request")


async def approve(client: httpx.AsyncClient, session: str, run_id: str) -> None:
    call_id = await _until_request(client, run_id)
    answer = {
        "session_id": session,
        "run_id": run_id,
        "name": "confirmation_response",
        "payload": {"tool_call_id": call_id, "approved": True},
    }
    accepted = await client.post("/external-events", json=answer)
    assert accepted.status_code == 202, accepted.text


async def finished(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        body = await view(client, run_id)
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    result: dict[str, Any] = await wait_for(done, within=60.0)
    return result


async def messages(client: httpx.AsyncClient, session: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{session}/messages")
    assert response.status_code == 200, response.text
    body: list[dict[str, Any]] = response.json()["messages"]
    return body


# --- the scenarios ---------------------------------------------------------------------------


async def reject_is_the_default(c1: httpx.AsyncClient, c2: httpx.AsyncClient) -> None:
    session = new_session()
    active = await start_waiting(c1, session, "a.md")
    for body in ({"input": "hi"}, {"input": "hi", "multitask_strategy": "reject"}):
        busy = await c2.post(f"/v1/sessions/{session}/runs", json=body)
        assert busy.status_code == 409, busy.text
        assert busy.json()["code"] == "session_busy"
        assert busy.json()["active_run_id"] == active
    invalid = await c2.post(
        f"/v1/sessions/{session}/runs", json={"input": "hi", "multitask_strategy": "later"}
    )
    assert invalid.status_code == 422
    await approve(c1, session, active)
    assert (await finished(c2, active))["status"] == "completed"


async def enqueue_runs_in_order(c1: httpx.AsyncClient, c2: httpx.AsyncClient) -> None:
    """Queued from both clients at once: each gets its own place, and the runs start, end
    and store their turns in the order of their places."""
    session = new_session()
    active = await start_waiting(c1, session, "a.md")
    url = f"/v1/sessions/{session}/runs"
    clients = [c1, c2] * 3

    async def enqueue(index: int) -> dict[str, Any]:
        body = {"input": f"queued {index}", "background": True, "multitask_strategy": "enqueue"}
        response = await clients[index].post(url, json=body)
        assert response.status_code == 202, response.text
        answer: dict[str, Any] = response.json()
        assert answer["status"] == "queued"
        return answer

    queued = await asyncio.gather(*(enqueue(index) for index in range(len(clients))))
    by_place = sorted(queued, key=lambda answer: answer["queue_position"])
    assert [a["queue_position"] for a in by_place] == list(range(1, len(clients) + 1))
    for answer in queued:  # seen alike from either worker
        for client in (c1, c2):
            seen = await view(client, answer["run_id"])
            assert seen["status"] == "queued"
            assert seen["queue_position"] == answer["queue_position"]
    # a reader of a queued run's events follows it once it starts
    last = by_place[-1]["run_id"]
    reader = asyncio.ensure_future(events_of(c2, last))
    await approve(c2, session, active)
    ends = [await finished(c1, answer["run_id"]) for answer in by_place]
    followed = await reader
    assert_well_formed(followed, last)
    assert followed[-1].type == "run.completed"
    assert all(end["status"] == "completed" for end in ends)
    starts = [end["started_at"] for end in ends]
    assert starts == sorted(starts)
    stored = [m["content"] for m in await messages(c2, session) if m["role"] == "user"]
    assert stored == ["delete a.md"] + [end["input"] for end in ends]


async def enqueue_blocking_waits_in_line(c1: httpx.AsyncClient, c2: httpx.AsyncClient) -> None:
    session = new_session()
    active = await start_waiting(c1, session, "a.md")
    body = {"input": "after you", "stream": False, "multitask_strategy": "enqueue"}
    waiting = asyncio.ensure_future(c2.post(f"/v1/sessions/{session}/runs", json=body))

    async def queued() -> bool:
        return await _queued_here(c2) == 1 or waiting.done()

    await wait_for(queued)
    assert not waiting.done()
    await approve(c1, session, active)
    answer = await waiting
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"
    assert answer.json()["output"]["content"] == "You said: after you"


async def _queued_here(client: httpx.AsyncClient) -> int:
    """Runs the client's worker keeps waiting in session queues (its debug state)."""
    state = (await client.get("/debug/state")).json()
    count: int = state["session_queued"]
    return count


async def enqueue_is_bounded_and_cancellable(
    c1: httpx.AsyncClient, c2: httpx.AsyncClient, bound: int
) -> None:
    session = new_session()
    active = await start_waiting(c1, session, "a.md")
    url = f"/v1/sessions/{session}/runs"
    body = {"background": True, "multitask_strategy": "enqueue"}
    ids = []
    for index in range(bound):
        client = (c1, c2)[index % 2]
        answer = await client.post(url, json={**body, "input": f"q{index}"})
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["run_id"])
    full = await c2.post(url, json={**body, "input": "one too many"})
    assert full.status_code == 429, full.text
    assert full.json()["code"] == "overloaded"
    assert "retry-after" in full.headers
    # cancelled while queued, from the worker that did not queue it
    cancel = await c2.post(f"/v1/runs/{ids[0]}/cancel")
    assert cancel.status_code == 202, cancel.text
    cancelled = await view(c1, ids[0])
    assert cancelled["status"] == "cancelled"
    assert cancelled["queue_position"] is None
    assert (await view(c1, ids[1]))["queue_position"] == 1
    # its place is free again
    again = await c1.post(url, json={**body, "input": "in its place"})
    assert again.status_code == 202, again.text
    ids.append(again.json()["run_id"])
    await approve(c1, session, active)
    ends = [await finished(c2, run_id) for run_id in ids[1:]]
    assert [end["status"] for end in ends] == ["completed"] * len(ends)
    assert (await view(c2, ids[0]))["status"] == "cancelled"
    stored = [m["content"] for m in await messages(c1, session) if m["role"] == "user"]
    assert "q0" not in stored


async def interrupt_keeps_a_stopped_turn(c1: httpx.AsyncClient, c2: httpx.AsyncClient) -> None:
    """Interrupting a run that waits for a confirmation withdraws the confirmation, stops the
    run as superseded (its turn kept, stopped) and starts the new run."""
    session = new_session()
    first = await c1.post(f"/v1/sessions/{session}/runs", json={"input": "hello", "stream": False})
    assert first.json()["status"] == "completed"
    active = await start_waiting(c1, session, "a.md")
    body = {"input": "never mind", "stream": False, "multitask_strategy": "interrupt"}
    answer = await c2.post(f"/v1/sessions/{session}/runs", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"
    events = await events_of(c2, active)
    assert events[-1].type == "run.cancelled"
    assert events[-1].data["data"]["reason"] == "superseded"
    withdrawn = events[-2]
    assert withdrawn.type == "custom"
    assert withdrawn.data["data"]["name"] == "confirmation_resolved"
    assert withdrawn.data["data"]["payload"]["outcome"] == "superseded"
    assert (await view(c1, active))["status"] == "cancelled"
    stored = await messages(c1, session)
    users = [m["content"] for m in stored if m["role"] == "user"]
    assert users == ["hello", "delete a.md", "never mind"]
    stopped = [m for m in stored if m["run_id"] == active]
    assert stopped and all(m["stopped"] == "superseded" for m in stopped)
    # a withdrawn confirmation takes no answer
    late = await c1.post(
        "/external-events",
        json={
            "session_id": session,
            "run_id": active,
            "name": "confirmation_response",
            "payload": {
                "tool_call_id": withdrawn.data["data"]["payload"]["tool_call_id"],
                "approved": True,
            },
        },
    )
    assert late.status_code == 409


async def rollback_removes_the_turn(c1: httpx.AsyncClient, c2: httpx.AsyncClient) -> None:
    session = new_session()
    first = await c1.post(f"/v1/sessions/{session}/runs", json={"input": "hello", "stream": False})
    assert first.json()["status"] == "completed"
    active = await start_waiting(c1, session, "a.md")
    # replacing any run but the active one: refused before anything is superseded
    stale = {"input": "x", "multitask_strategy": "rollback", "replaces": first.json()["run_id"]}
    refused = await c2.post(f"/v1/sessions/{session}/runs", json=stale)
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "turn_not_latest"
    assert (await view(c2, active))["status"] == "waiting"
    body = {"input": "instead", "stream": False, "multitask_strategy": "rollback"}
    answer = await c2.post(f"/v1/sessions/{session}/runs", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"]["content"] == "You said: instead"
    events = await events_of(c1, active)
    assert events[-1].data["data"]["reason"] == "superseded"
    stored = await messages(c2, session)
    assert [m["content"] for m in stored if m["role"] == "user"] == ["hello", "instead"]
    assert all(m["run_id"] != active for m in stored)
    assert all("stopped" not in m for m in stored)
