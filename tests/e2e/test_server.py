"""The contract over real HTTP: every endpoint and status, every SSE event type, confirmations,
resume, busy sessions, a full server."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import httpx

from tests.support.server import Launch, Server
from tests.support.sse import Event, assert_well_formed, open_stream, read_events
from tests.support.waiting import wait_for

PROBLEM = "application/problem+json"
ALL_TYPES = {
    "run.started",
    "text.delta",
    "tool.call.started",
    "tool.call.completed",
    "custom",
    "usage",
    "run.completed",
    "run.failed",
    "run.cancelled",
}


def new_session() -> str:
    return f"e2e-{uuid.uuid4().hex[:12]}"


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status
    assert {"type", "title", "detail"} <= body.keys()
    return body


async def stream_run(
    client: httpx.AsyncClient, session: str, text: str, **extra: Any
) -> tuple[list[Event], httpx.Response]:
    return await read_events(
        client, "POST", f"/v1/sessions/{session}/runs", json={"input": text, **extra}
    )


async def run_status(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return body


async def finished(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        body = await run_status(client, run_id)
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    result: dict[str, Any] = await wait_for(done)
    return result


async def test_every_endpoint_and_status(server: Server) -> None:
    async with server.client() as client:
        session = new_session()
        # 200 SSE
        events, response = await stream_run(client, session, "hello")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        run_id = response.headers["x-run-id"]
        assert_well_formed(events, run_id)
        # 200 JSON
        blocking = await client.post(
            f"/v1/sessions/{session}/runs", json={"input": "again", "stream": False}
        )
        assert blocking.status_code == 200
        assert blocking.json()["output"] == {"content": "You said: again"}
        assert blocking.headers["x-run-id"] == blocking.json()["run_id"]
        # 202 background
        background = await client.post(
            f"/v1/sessions/{session}/runs", json={"input": "delete a.txt", "background": True}
        )
        assert background.status_code == 202
        bg_id = background.json()["run_id"]
        assert background.headers["x-run-id"] == bg_id
        assert set(background.json()) == {"run_id", "status", "events_url"}

        async def waiting() -> bool:
            return bool((await run_status(client, bg_id))["status"] == "waiting")

        await wait_for(waiting)
        # 409 busy
        busy = await client.post(f"/v1/sessions/{session}/runs", json={"input": "x"})
        assert_problem(busy, 409, "session_busy")
        # session summary while active; delete refused
        summary = (await client.get(f"/v1/sessions/{session}")).json()
        assert summary["active_run_id"] == bg_id
        assert_problem(await client.delete(f"/v1/sessions/{session}"), 409, "session_busy")
        # cancel: 202, then 200 once finished, 404 unknown
        cancel = await client.post(f"/v1/runs/{bg_id}/cancel")
        assert cancel.status_code == 202 and cancel.json()["status"] == "cancelling"
        assert (await finished(client, bg_id))["status"] == "cancelled"
        done = await client.post(f"/v1/runs/{bg_id}/cancel")
        assert done.status_code == 200 and done.json()["status"] == "cancelled"
        assert_problem(await client.post("/v1/runs/run_nope/cancel"), 404, "not_found")
        # GET run: 200, 404
        assert (await client.get(f"/v1/runs/{run_id}")).status_code == 200
        assert_problem(await client.get("/v1/runs/run_nope"), 404, "not_found")
        # events: 200 replay, 404
        replayed, replay = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
        assert replay.status_code == 200 and replayed == events
        assert_problem(await client.get("/v1/runs/run_nope/events"), 404, "not_found")
        # external events: 202 and 409 in test_confirmations; 404 and 422 here
        assert_problem(
            await client.post(
                "/external-events",
                json={"session_id": new_session(), "name": "confirmation_response"},
            ),
            404,
            "not_found",
        )
        assert_problem(
            await client.post("/external-events", json={"name": 3}), 422, "validation_error"
        )
        # messages: 200, 404
        messages = (await client.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        assert [m["content"] for m in messages] == [
            "hello",
            "You said: hello",
            "again",
            "You said: again",
            # the cancelled run's stopped turn: its prompt, the call it was waiting to make,
            # and that call closed as cut short
            "delete a.txt",
            None,
            "Error: the run was cancelled before this call returned",
        ]
        assert [m.get("stopped") for m in messages[4:]] == ["cancel_requested"] * 3
        assert_problem(await client.get(f"/v1/sessions/{new_session()}/messages"), 404, "not_found")
        # 413 declared and chunked; 422
        big = await client.post(
            f"/v1/sessions/{session}/runs", json={"input": "x" * 1_100_000, "stream": False}
        )
        assert_problem(big, 413, "payload_too_large")

        async def chunks() -> Any:
            yield b'{"input": "'
            for _ in range(40):
                yield b"y" * 30_000
            yield b'"}'

        chunked = await client.post(f"/v1/sessions/{session}/runs", content=chunks())
        assert_problem(chunked, 413, "payload_too_large")
        assert_problem(
            await client.post(f"/v1/sessions/{session}/runs", json={}), 422, "validation_error"
        )
        assert_problem(
            await client.post("/v1/sessions/bad%20id/runs", json={"input": "x"}),
            422,
            "validation_error",
        )
        # delete: 204, then 404
        assert (await client.delete(f"/v1/sessions/{session}")).status_code == 204
        assert_problem(await client.delete(f"/v1/sessions/{session}"), 404, "not_found")
        assert_problem(await client.get(f"/v1/sessions/{session}"), 404, "not_found")
        # operations
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "agent_runs_total" in metrics.text
        assert (await client.get("/")).status_code == 200
        assert_problem(await client.get("/no/such/thing"), 404, "not_found")
        assert_problem(await client.put(f"/v1/runs/{run_id}"), 405, "method_not_allowed")


async def test_every_event_type(server: Server) -> None:
    async with server.client() as client:
        seen: set[str] = set()
        for text, extra in [
            ("what time is it", {}),
            ("what time is it", {"max_iterations": 1}),
        ]:
            events, response = await stream_run(client, new_session(), text, **extra)
            assert_well_formed(events, response.headers["x-run-id"])
            seen |= {e.type for e in events}
        session = new_session()
        async with open_stream(
            client, "POST", f"/v1/sessions/{session}/runs", json={"input": "delete b.txt"}
        ) as (response, stream):
            run_id = response.headers["x-run-id"]
            events = []
            async for event in stream:
                events.append(event)
                if event.type == "custom":
                    assert (await client.post(f"/v1/runs/{run_id}/cancel")).status_code == 202
        assert_well_formed(events, run_id)
        assert events[-1].data["data"] == {"reason": "cancel_requested"}
        seen |= {e.type for e in events}
        assert seen == ALL_TYPES
        failed = await stream_run(client, new_session(), "what time is it", max_iterations=1)
        assert failed[0][-1].data["data"]["error"]["code"] == "max_iterations"


async def confirm(server: Server, approved: bool) -> tuple[list[Event], str]:
    async with server.client() as client:
        session = new_session()
        events: list[Event] = []
        async with open_stream(
            client, "POST", f"/v1/sessions/{session}/runs", json={"input": "delete plans.md"}
        ) as (response, stream):
            run_id = response.headers["x-run-id"]
            async for event in stream:
                events.append(event)
                if event.type != "custom" or event.data["data"]["name"] != "confirmation_requested":
                    continue
                request = event.data["data"]
                payload = request["payload"]
                assert set(payload) == {
                    "tool_call_id",
                    "tool",
                    "arguments",
                    "question",
                    "response_event",
                    "expires_at",
                }
                assert payload["tool"] == "delete_file"
                assert payload["arguments"] == {"path": "plans.md"}
                assert (await run_status(client, run_id))["status"] == "waiting"
                answer = {
                    "session_id": session,
                    "run_id": run_id,
                    "name": payload["response_event"],
                    "payload": {"tool_call_id": payload["tool_call_id"], "approved": approved},
                }
                accepted = await client.post("/external-events", json=answer)
                assert accepted.status_code == 202
                assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}
                duplicate = await client.post("/external-events", json=answer)
                assert_problem(duplicate, 409, "not_accepted")
                assert duplicate.json()["accepted_by"] == []
        assert_well_formed(events, run_id)
        customs = [e.data["data"]["name"] for e in events if e.type == "custom"]
        assert customs[0] == "confirmation_requested"
        return events, run_id


async def test_confirmation_approved(server: Server) -> None:
    events, _ = await confirm(server, approved=True)
    assert events[-1].type == "run.completed"
    assert "Deleted plans.md" in events[-1].data["data"]["output"]["content"]
    result = next(e for e in events if e.type == "tool.call.completed").data["data"]
    assert result["is_error"] is False


async def test_confirmation_denied(server: Server) -> None:
    events, _ = await confirm(server, approved=False)
    assert events[-1].type == "run.completed"
    assert "did not delete plans.md" in events[-1].data["data"]["output"]["content"]
    result = next(e for e in events if e.type == "tool.call.completed").data["data"]
    assert result["is_error"] is True


async def cut_and_resume(
    client: httpx.AsyncClient, rng: random.Random, policy: str
) -> tuple[list[Event], list[Event]]:
    """Stream a long run, cut after a random event, resume with Last-Event-ID."""
    session = new_session()
    words = " ".join(f"w{i}" for i in range(120))
    cut = rng.randint(1, 60)
    received, response = await read_events(
        client,
        "POST",
        f"/v1/sessions/{session}/runs",
        json={"input": words, "on_disconnect": policy},
        stop_after=cut,
    )
    run_id = response.headers["x-run-id"]
    assert len(received) == cut
    resumed, again = await read_events(
        client,
        "GET",
        f"/v1/runs/{run_id}/events",
        headers={"Last-Event-ID": str(received[-1].id)},
    )
    assert again.status_code == 200
    full, _ = await read_events(client, "GET", f"/v1/runs/{run_id}/events?after=0")
    assert_well_formed(full, run_id)
    return received + resumed, full


async def test_resume_after_a_cut_at_many_points(server: Server) -> None:
    rng = random.Random(20261130)
    async with server.client() as client:
        results = await asyncio.gather(
            *(cut_and_resume(client, rng, "continue") for _ in range(24)),
            *(cut_and_resume(client, rng, "cancel") for _ in range(8)),
        )
    for union, full in results[:24]:
        assert union == full
        assert full[-1].type == "run.completed"
    for union, full in results[24:]:
        # cancelled on the cut (or completed if it raced to the end first)
        assert union == full
        assert full[-1].type in ("run.cancelled", "run.completed")


async def test_full_server_answers_429(start_server: Launch) -> None:
    server = start_server(
        {
            "AGENT_MAX_CONCURRENT_RUNS": "2",
            "AGENT_MAX_QUEUED_RUNS": "1",
            "AGENT_QUEUE_TIMEOUT": "0.5",
        }
    )
    async with server.client() as client:
        holders = [
            await client.post(
                f"/v1/sessions/{new_session()}/runs",
                json={"input": "delete x", "background": True},
            )
            for _ in range(2)
        ]
        assert all(h.status_code == 202 for h in holders)
        queued = asyncio.ensure_future(
            client.post(f"/v1/sessions/{new_session()}/runs", json={"input": "q", "stream": False})
        )

        async def one_queued() -> bool:
            state = (await client.get("/debug/state")).json()
            return bool(state["admission_queued"] == 1)

        await wait_for(one_queued)
        full = await client.post(f"/v1/sessions/{new_session()}/runs", json={"input": "x"})
        assert_problem(full, 429, "overloaded")
        assert int(full.headers["retry-after"]) >= 1
        timed_out = await queued
        assert_problem(timed_out, 429, "overloaded")
        assert timed_out.headers["retry-after"]
        for holder in holders:
            await client.post(f"/v1/runs/{holder.json()['run_id']}/cancel")
        ok = await client.post(
            f"/v1/sessions/{new_session()}/runs", json={"input": "x", "stream": False}
        )
        assert ok.status_code == 200


async def test_authentication(start_server: Launch) -> None:
    server = start_server({"AGENT_API_KEYS": "key-alice=alice,key-bob=bob"})
    async with (
        server.client(headers={"Authorization": "Bearer key-alice"}) as alice,
        server.client(headers={"Authorization": "Bearer key-bob"}) as bob,
        server.client() as nobody,
    ):
        session = new_session()
        unauthorized = await nobody.post(f"/v1/sessions/{session}/runs", json={"input": "x"})
        assert_problem(unauthorized, 401, "unauthorized")
        assert unauthorized.headers["www-authenticate"].startswith("Bearer")
        events, response = await stream_run(alice, session, "mine")
        run_id = response.headers["x-run-id"]
        assert_well_formed(events, run_id)
        assert_problem(await bob.get(f"/v1/runs/{run_id}"), 404, "not_found")
        assert_problem(await bob.get(f"/v1/sessions/{session}"), 404, "not_found")
        assert_problem(
            await bob.post(f"/v1/sessions/{session}/runs", json={"input": "theirs"}),
            404,
            "not_found",
        )
        assert (await alice.get(f"/v1/runs/{run_id}")).status_code == 200


async def test_list_sessions(start_server: Launch) -> None:
    server = start_server({"AGENT_API_KEYS": "key-alice=alice,key-bob=bob"})
    async with (
        server.client(headers={"Authorization": "Bearer key-alice"}) as alice,
        server.client(headers={"Authorization": "Bearer key-bob"}) as bob,
        server.client() as nobody,
    ):
        assert_problem(await nobody.get("/v1/sessions"), 401, "unauthorized")
        assert (await alice.get("/v1/sessions")).json() == {"sessions": [], "next": None}
        mine = [new_session() for _ in range(5)]
        for session in mine:
            blocking = await alice.post(
                f"/v1/sessions/{session}/runs", json={"input": "hi", "stream": False}
            )
            assert blocking.status_code == 200
        theirs = new_session()
        await bob.post(f"/v1/sessions/{theirs}/runs", json={"input": "hi", "stream": False})

        listed = (await alice.get("/v1/sessions")).json()
        assert [item["session_id"] for item in listed["sessions"]] == mine[::-1]
        assert listed["next"] is None
        first = listed["sessions"][0]
        assert first == (await alice.get(f"/v1/sessions/{mine[-1]}")).json()
        assert set(first) == {
            "session_id",
            "created_at",
            "updated_at",
            "message_count",
            "last_run_id",
            "active_run_id",
            "title",
            "stateless",
        }
        bobs = (await bob.get("/v1/sessions")).json()["sessions"]
        assert [item["session_id"] for item in bobs] == [theirs]

        # page by page; sessions started between two pages do not shift the next one
        page = (await alice.get("/v1/sessions", params={"limit": 2})).json()
        assert [item["session_id"] for item in page["sessions"]] == [mine[4], mine[3]]
        newer = new_session()
        await alice.post(f"/v1/sessions/{newer}/runs", json={"input": "hi", "stream": False})
        seen = [item["session_id"] for item in page["sessions"]]
        while page["next"] is not None:
            page = (
                await alice.get("/v1/sessions", params={"limit": 2, "before": page["next"]})
            ).json()
            seen += [item["session_id"] for item in page["sessions"]]
        assert seen == mine[::-1]
        front = (await alice.get("/v1/sessions", params={"limit": 1})).json()["sessions"]
        assert [item["session_id"] for item in front] == [newer]

        # a run waiting for an answer holds its session: the list says which run
        waiting = await alice.post(
            f"/v1/sessions/{mine[0]}/runs", json={"input": "delete a.txt", "background": True}
        )
        run_id = waiting.json()["run_id"]

        async def listed_as_active() -> bool:
            items = (await alice.get("/v1/sessions", params={"limit": 100})).json()["sessions"]
            active = {item["session_id"]: item["active_run_id"] for item in items}
            return active[mine[0]] == run_id and list(active.values()).count(None) == 5

        await wait_for(listed_as_active)
        assert (await alice.post(f"/v1/runs/{run_id}/cancel")).status_code == 202
        assert (await finished(alice, run_id))["status"] == "cancelled"

        async def none_active() -> bool:
            items = (await alice.get("/v1/sessions")).json()["sessions"]
            return all(item["active_run_id"] is None for item in items)

        await wait_for(none_active)  # the lock goes once the run has wound down

        for params in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"before": "opaque?"}):
            assert_problem(await alice.get("/v1/sessions", params=params), 422, "validation_error")
