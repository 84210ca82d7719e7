"""The HTTP API in-process: statuses, bodies and problems (buffered answers only)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.storage import RunRecord, StorageUnavailable, open_store
from tests.support.served import MakeSettings, Serve, Served, assert_problem, run_blocking
from tests.support.waiting import wait_until


async def wait_finished(served: Served, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = {}

    async def finished() -> bool:
        nonlocal result
        response = await served.client.get(f"/v1/runs/{run_id}")
        result = response.json()
        return result["status"] in ("completed", "failed", "cancelled")

    await wait_until(finished)
    return result


async def test_health_ready_metrics_and_ui(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert "agent_runs_in_flight" in metrics.text
        assert "agent_run_duration_seconds" in metrics.text
        index = await client.get("/")
        assert index.status_code == 200
        assert "text/html" in index.headers["content-type"]
        # browsers revalidate the UI's files, so an upgrade shows at once
        assert index.headers["cache-control"] == "no-cache"
        again = await client.get("/", headers={"if-none-match": index.headers["etag"]})
        assert again.status_code == 304


async def test_blocking_run_answers_the_result(serve: Serve) -> None:
    async with serve() as served:
        response = await run_blocking(served, "s1", "hello")
        assert response.status_code == 200
        body = response.json()
        assert response.headers["x-run-id"] == body["run_id"]
        assert body["run_id"].startswith("run_") and len(body["run_id"]) == 4 + 32
        assert body["status"] == "completed"
        assert body["output"] == {"content": "You said: hello"}
        assert body["error"] is None
        assert body["usage"]["output_tokens"] > 0
        run = (await served.client.get(f"/v1/runs/{body['run_id']}")).json()
        assert run["status"] == "completed"
        assert run["input"] == "hello"
        assert run["output"] == {"content": "You said: hello"}
        assert run["finished_at"].endswith("Z")
        metrics = (await served.client.get("/metrics")).text
        assert 'agent_runs_total{outcome="completed"} 1.0' in metrics


async def test_background_run_answers_202_then_completes(serve: Serve) -> None:
    async with serve() as served:
        response = await served.client.post(
            "/v1/sessions/bg/runs", json={"input": "what time is it", "background": True}
        )
        assert response.status_code == 202
        body = response.json()
        run_id = body["run_id"]
        assert response.headers["x-run-id"] == run_id
        assert body["status"] in ("queued", "running")
        assert body["events_url"] == f"/v1/runs/{run_id}/events"
        result = await wait_finished(served, run_id)
        assert result["status"] == "completed"
        assert result["output"]["content"].startswith("The time is ")


async def test_session_summary_messages_and_delete(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        first = (await run_blocking(served, "conv", "one")).json()
        await run_blocking(served, "conv", "two")
        summary = (await client.get("/v1/sessions/conv")).json()
        assert summary["session_id"] == "conv"
        assert summary["message_count"] == 4
        assert summary["active_run_id"] is None
        messages = (await client.get("/v1/sessions/conv/messages")).json()["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [
            ("user", "one"),
            ("assistant", "You said: one"),
            ("user", "two"),
            ("assistant", "You said: two"),
        ]
        assert [m["position"] for m in messages] == [0, 1, 2, 3]
        assert messages[0]["run_id"] == first["run_id"]
        assert (await client.delete("/v1/sessions/conv")).status_code == 204
        assert_problem(await client.get("/v1/sessions/conv"), 404, "not_found")
        assert_problem(await client.get("/v1/sessions/conv/messages"), 404, "not_found")
        assert_problem(await client.delete("/v1/sessions/conv"), 404, "not_found")
        assert_problem(await client.get(f"/v1/runs/{first['run_id']}"), 404, "not_found")


async def list_all(
    client: httpx.AsyncClient, headers: dict[str, str], limit: int
) -> list[list[dict[str, Any]]]:
    """Every page of GET /v1/sessions, following ``next`` to the end."""
    pages: list[list[dict[str, Any]]] = []
    query = f"?limit={limit}"
    while True:
        response = await client.get(f"/v1/sessions{query}", headers=headers)
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"sessions", "next"}
        pages.append(body["sessions"])
        if body["next"] is None:
            return pages
        query = f"?limit={limit}&before={body['next']}"


async def test_list_sessions(serve: Serve) -> None:
    async with serve(api_keys="key-a=alice,key-b=bob", demo_slow_seconds=0.3) as served:
        client = served.client
        alice = {"Authorization": "Bearer key-a"}
        bob = {"Authorization": "Bearer key-b"}
        assert (await client.get("/v1/sessions", headers=alice)).json() == {
            "sessions": [],
            "next": None,
        }
        for name in ("a-0", "a-1", "a-2", "a-3", "a-4"):
            await run_blocking(served, name, "hi", headers=alice)
        await run_blocking(served, "b-0", "hi", headers=bob)
        await run_blocking(served, "a-1", "again", headers=alice)  # a-1 moves to the front

        listed = (await client.get("/v1/sessions", headers=alice)).json()
        ids = [item["session_id"] for item in listed["sessions"]]
        assert ids == ["a-1", "a-4", "a-3", "a-2", "a-0"]
        assert listed["next"] is None
        # each item is what GET /v1/sessions/{id} answers
        for item in listed["sessions"]:
            assert (
                item
                == (await client.get(f"/v1/sessions/{item['session_id']}", headers=alice)).json()
            )
        assert listed["sessions"][0]["message_count"] == 4
        bobs = (await client.get("/v1/sessions", headers=bob)).json()["sessions"]
        assert [item["session_id"] for item in bobs] == ["b-0"]

        pages = await list_all(client, alice, 2)
        assert [[item["session_id"] for item in page] for page in pages] == [
            ["a-1", "a-4"],
            ["a-3", "a-2"],
            ["a-0"],
        ]
        # exactly one page: its next is null, not a cursor to an empty page
        assert len(await list_all(client, alice, 5)) == 1

        # the active run comes from the session locks, for every item in one call
        started = await client.post(
            "/v1/sessions/a-3/runs", json={"input": "slow a b c", "background": True}, headers=alice
        )
        run_id = started.json()["run_id"]
        listed = (await client.get("/v1/sessions", headers=alice)).json()["sessions"]
        assert {item["session_id"]: item["active_run_id"] for item in listed} == {
            "a-1": None,
            "a-4": None,
            "a-3": run_id,
            "a-2": None,
            "a-0": None,
        }
        await client.post(f"/v1/runs/{run_id}/cancel", headers=alice)

        assert_problem(await client.get("/v1/sessions"), 401, "unauthorized")
        for bad in (
            "limit=0",
            "limit=101",
            "limit=-1",
            "limit=abc",
            "limit=2.5",
            "limit=",
            "before=",
            "before=nope",
            "before=123",
            "before=.a-1",
            "before=123.bad%20id",
            "before=123456789012345678.a-1",
            f"before={'1' * 17}.{'x' * 129}",
        ):
            body = assert_problem(
                await client.get(f"/v1/sessions?{bad}", headers=alice), 422, "validation_error"
            )
            assert body["errors"][0]["loc"] == ["query", bad.partition("=")[0]], bad
        # the largest cursor the schema admits is still a time: a page, not an error
        far = await client.get(f"/v1/sessions?before={'9' * 17}.a-1", headers=alice)
        assert len(far.json()["sessions"]) == 5
        await served.wait_idle()


async def test_the_conversation_carries_over_between_runs(serve: Serve) -> None:
    async with serve() as served:
        await run_blocking(served, "memory", "what time is it")
        await run_blocking(served, "memory", "hello again")
        messages = (await served.client.get("/v1/sessions/memory/messages")).json()["messages"]
        assert [m["role"] for m in messages] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]
        assert messages[1]["tool_calls"][0]["name"] == "current_time"


async def test_busy_session_and_delete_while_active(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.3) as served:
        client = served.client
        started = await client.post(
            "/v1/sessions/busy/runs", json={"input": "slow a b c d e", "background": True}
        )
        run_id = started.json()["run_id"]
        busy = await client.post("/v1/sessions/busy/runs", json={"input": "x", "stream": False})
        body = assert_problem(busy, 409, "session_busy")
        assert body["active_run_id"] == run_id
        summary = (await client.get("/v1/sessions/busy")).json()
        assert summary["active_run_id"] == run_id
        live = (await client.get(f"/v1/runs/{run_id}")).json()
        assert (live["status"], live["input"]) == ("running", "slow a b c d e")
        assert_problem(await client.delete("/v1/sessions/busy"), 409, "session_busy")
        cancel = await client.post(f"/v1/runs/{run_id}/cancel")
        assert cancel.status_code == 202
        assert cancel.json() == {"run_id": run_id, "status": "cancelling"}
        again = await client.post(f"/v1/runs/{run_id}/cancel")
        assert again.status_code in (200, 202)
        result = await wait_finished(served, run_id)
        assert result["status"] == "cancelled"
        finished = await client.post(f"/v1/runs/{run_id}/cancel")
        assert finished.status_code == 200
        assert finished.json() == {"run_id": run_id, "status": "cancelled"}
        assert (await client.delete("/v1/sessions/busy")).status_code == 204
        assert (
            'agent_runs_rejected_total{reason="session_busy"} 1.0'
            in (await client.get("/metrics")).text
        )


async def test_errors_are_problems(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        assert_problem(await client.get("/nowhere"), 404, "not_found")
        assert_problem(await client.get("/v1/runs/run_unknown"), 404, "not_found")
        assert_problem(await client.get("/v1/runs/bad id!"), 404, "not_found")
        assert_problem(await client.get("/v1/runs/run_unknown/events"), 404, "not_found")
        assert_problem(await client.post("/v1/runs/run_unknown/cancel"), 404, "not_found")
        assert_problem(await client.put("/v1/runs/run_unknown"), 405, "method_not_allowed")
        assert_problem(await client.get("/v1/sessions/nobody"), 404, "not_found")
        body = assert_problem(
            await client.post("/v1/sessions/s/runs", json={"stream": False}),
            422,
            "validation_error",
        )
        assert body["errors"][0]["loc"] == ["body", "input"]
        assert_problem(
            await client.post("/v1/sessions/s/runs", content=b"{not json", headers={}),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post("/v1/sessions/s/runs", json={"input": "x", "unknown": 1}),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post(
                "/v1/sessions/s/runs", json={"input": "x", "on_disconnect": "explode"}
            ),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post("/v1/sessions/s/runs", json={"input": "x", "agent": "nope"}),
            404,
            "not_found",
        )
        assert_problem(
            await client.post("/v1/sessions/a/b/runs", json={"input": "x"}), 404, "not_found"
        )
        for bad in ("a" * 129, "sp ace", "semi;colon", "comma,", "%C3%A9"):
            assert_problem(
                await client.post(f"/v1/sessions/{bad}/runs", json={"input": "x"}),
                422,
                "validation_error",
            )
        ok = await run_blocking(served, "A-z.0_9:x", "fine")
        assert ok.status_code == 200
        assert_problem(
            await client.get("/v1/runs/x/events", headers={"Last-Event-ID": "abc"}),
            422,
            "validation_error",
        )


async def test_unexpected_errors_are_500_problems_without_traceback(serve: Serve) -> None:
    async with serve() as served:

        async def broken(session_id: str) -> None:
            raise RuntimeError("secret internals")

        served.services.store.get_session = broken  # type: ignore[method-assign]
        response = await served.client.get("/v1/sessions/anything")
        body = assert_problem(response, 500, "internal")
        assert "secret internals" not in response.text
        assert body["title"] == "Internal error"


async def test_storage_outage_is_503(serve: Serve) -> None:
    async with serve() as served:

        async def down(session_id: str) -> None:
            raise StorageUnavailable("database is gone")

        served.services.store.get_session = down  # type: ignore[method-assign]
        response = await served.client.get("/v1/sessions/anything")
        assert_problem(response, 503, "unavailable")
        assert response.headers["retry-after"]
        assert "database is gone" not in response.text


async def test_request_body_limit(serve: Serve) -> None:
    async with serve(max_body_bytes=100) as served:
        big = {"input": "x" * 200, "stream": False}
        assert_problem(
            await served.client.post("/v1/sessions/s/runs", json=big), 413, "payload_too_large"
        )

        async def chunks() -> Any:
            for _ in range(10):
                yield b'{"input": "' + b"y" * 20
            yield b'"}'

        # a generator body is sent chunked, without Content-Length
        response = await served.client.post("/v1/sessions/s/runs", content=chunks())
        assert "content-length" not in response.request.headers
        assert_problem(response, 413, "payload_too_large")
        small = await served.client.post(
            "/v1/sessions/s/runs", json={"input": "hi", "stream": False}
        )
        assert small.status_code == 200


async def test_authentication_and_ownership(serve: Serve) -> None:
    async with serve(api_keys="key-a=alice, key-b=bob") as served:
        client = served.client
        alice = {"Authorization": "Bearer key-a"}
        bob = {"Authorization": "Bearer key-b"}
        missing = await client.post("/v1/sessions/s/runs", json={"input": "x"})
        assert_problem(missing, 401, "unauthorized")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = await client.get("/v1/runs/x", headers={"Authorization": "Bearer nope"})
        assert_problem(wrong, 401, "unauthorized")
        assert "nope" not in wrong.text
        assert_problem(
            await client.get("/v1/runs/x", headers={"Authorization": "Basic a2V5LWE="}),
            401,
            "unauthorized",
        )
        assert (await client.get("/healthz")).status_code == 200
        started = await client.post(
            "/v1/sessions/mine/runs", json={"input": "hi", "stream": False}, headers=alice
        )
        run_id = started.json()["run_id"]
        assert (await client.get(f"/v1/runs/{run_id}", headers=alice)).status_code == 200
        # everything of alice's is invisible to bob: 404, never 403
        assert_problem(await client.get(f"/v1/runs/{run_id}", headers=bob), 404, "not_found")
        assert_problem(await client.get(f"/v1/runs/{run_id}/events", headers=bob), 404, "not_found")
        assert_problem(
            await client.post(f"/v1/runs/{run_id}/cancel", headers=bob), 404, "not_found"
        )
        assert_problem(await client.get("/v1/sessions/mine", headers=bob), 404, "not_found")
        assert_problem(
            await client.get("/v1/sessions/mine/messages", headers=bob), 404, "not_found"
        )
        assert_problem(await client.delete("/v1/sessions/mine", headers=bob), 404, "not_found")
        assert_problem(
            await client.post(
                "/v1/sessions/mine/runs", json={"input": "x", "stream": False}, headers=bob
            ),
            404,
            "not_found",
        )
        assert_problem(
            await client.post(
                "/external-events",
                json={"session_id": "mine", "name": "confirmation_response", "payload": {}},
                headers=bob,
            ),
            404,
            "not_found",
        )
        assert (await client.get("/v1/sessions/mine", headers=alice)).status_code == 200


async def test_cors(serve: Serve) -> None:
    async with serve(cors_origins="https://ui.example") as served:
        preflight = await served.client.options(
            "/v1/sessions/s/runs",
            headers={
                "Origin": "https://ui.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://ui.example"
        answer = await served.client.post(
            "/v1/sessions/s/runs",
            json={"input": "x", "stream": False},
            headers={"Origin": "https://ui.example"},
        )
        assert answer.headers["access-control-allow-origin"] == "https://ui.example"
        assert "X-Run-Id" in answer.headers["access-control-expose-headers"]
        other = await served.client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


async def test_cors_lets_a_langgraph_page_send_its_key_and_read_the_run(serve: Serve) -> None:
    # the LangGraph SDKs (useStream in a page) send the key as X-Api-Key, and read a streamed
    # run's id from Content-Location
    async with serve(cors_origins="https://ui.example", api_keys="k=alice") as served:
        preflight = await served.client.options(
            "/langgraph/threads/t/runs/stream",
            headers={
                "Origin": "https://ui.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-api-key",
            },
        )
        assert preflight.status_code == 200, preflight.text
        assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()
        answer = await served.client.post(
            "/langgraph/threads",
            json={},
            headers={"Origin": "https://ui.example", "X-Api-Key": "k"},
        )
        assert answer.status_code == 200, answer.text
        assert "Content-Location" in answer.headers["access-control-expose-headers"]


async def test_external_event_errors(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        body = {"session_id": "ext", "name": "confirmation_response", "payload": {}}
        assert_problem(await client.post("/external-events", json=body), 404, "not_found")
        await run_blocking(served, "ext", "hi")
        refused = await client.post("/external-events", json=body)
        problem = assert_problem(refused, 409, "not_accepted")
        assert problem["accepted_by"] == []
        assert_problem(
            await client.post("/external-events", json={"session_id": "ext"}),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post("/external-events", json={**body, "name": "  "}),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post("/external-events", json={**body, "payload": [1]}),
            422,
            "validation_error",
        )
        assert_problem(
            await client.post("/external-events", json={**body, "session_id": "bad id"}),
            422,
            "validation_error",
        )


async def confirm_over_http(served: Served, approved: bool) -> dict[str, Any]:
    client = served.client
    started = await client.post(
        "/v1/sessions/confirm/runs", json={"input": "delete notes.txt", "background": True}
    )
    run_id = started.json()["run_id"]

    async def waiting() -> bool:
        return bool((await client.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting")

    await wait_until(waiting)
    subscription = await served.services.bus.events.subscribe(run_id)
    logged = await subscription.next()
    await subscription.aclose()
    request_event = next(e for e in logged if e.type == "custom").document["data"]
    assert request_event["name"] == "confirmation_requested"
    payload = request_event["payload"]
    assert payload["tool"] == "delete_file"
    assert payload["arguments"] == {"path": "notes.txt"}
    assert payload["response_event"] == "confirmation_response"
    answer = {
        "session_id": "confirm",
        "run_id": run_id,
        "name": "confirmation_response",
        "payload": {"tool_call_id": payload["tool_call_id"], "approved": approved},
    }
    accepted = await client.post("/external-events", json=answer)
    assert accepted.status_code == 202
    assert accepted.json() == {"accepted_by": ["ConfirmationExtension"]}
    duplicate = await client.post("/external-events", json=answer)
    assert_problem(duplicate, 409, "not_accepted")
    return await wait_finished(served, run_id)


async def test_confirmation_approved(serve: Serve) -> None:
    async with serve() as served:
        result = await confirm_over_http(served, approved=True)
        assert result["status"] == "completed"
        assert "Deleted notes.txt" in result["output"]["content"]


async def test_confirmation_denied(serve: Serve) -> None:
    async with serve() as served:
        result = await confirm_over_http(served, approved=False)
        assert result["status"] == "completed"
        assert "did not delete notes.txt" in result["output"]["content"]
        metrics = (await served.client.get("/metrics")).text
        assert 'agent_external_events_total{outcome="accepted"} 1.0' in metrics
        assert 'agent_external_events_total{outcome="not_accepted"} 1.0' in metrics


async def test_full_server_answers_429(serve: Serve) -> None:
    async with serve(
        max_concurrent_runs=1, max_queued_runs=1, queue_timeout=0.2, demo_slow_seconds=0.1
    ) as served:
        client = served.client
        first = await client.post(
            "/v1/sessions/a/runs", json={"input": "slow a b c", "background": True}
        )
        assert first.status_code == 202
        # the queue's one place: a blocking request waits in it, then times out
        queued = asyncio.ensure_future(
            client.post("/v1/sessions/b/runs", json={"input": "x", "stream": False})
        )

        async def in_queue() -> bool:
            return served.services.admission.queued == 1

        await wait_until(in_queue)
        full = await client.post("/v1/sessions/c/runs", json={"input": "x", "stream": False})
        assert_problem(full, 429, "overloaded")
        assert full.headers["retry-after"]
        timed_out = await queued
        assert_problem(timed_out, 429, "overloaded")
        assert timed_out.headers["retry-after"]
        metrics = (await client.get("/metrics")).text
        assert 'agent_runs_rejected_total{reason="overloaded"} 1.0' in metrics
        assert 'agent_runs_rejected_total{reason="queue_timeout"} 1.0' in metrics
        await wait_finished(served, first.json()["run_id"])
        await served.wait_idle()


async def test_a_full_worker_refuses_before_parsing_but_after_authenticating(
    serve: Serve,
) -> None:
    async with serve(
        max_concurrent_runs=1, max_queued_runs=0, demo_slow_seconds=0.1, api_keys="key-a=alice"
    ) as served:
        client = served.client
        auth = {"Authorization": "Bearer key-a"}
        json_headers = {**auth, "Content-Type": "application/json"}

        async def garbage(session: str) -> httpx.Response:
            return await client.post(
                f"/v1/sessions/{session}/runs", content=b"{not json", headers=json_headers
            )

        # not full: the body is parsed and refused for what it is
        assert_problem(await garbage("a"), 422, "validation_error")
        first = await client.post(
            "/v1/sessions/a/runs", json={"input": "slow a b", "background": True}, headers=auth
        )
        assert first.status_code == 202
        # full: refused at once, body unread, the same answer the run manager gives
        shed = await garbage("b")
        assert_problem(shed, 429, "overloaded")
        assert shed.headers["retry-after"] == "1"
        # but a caller without a valid key still learns that first
        anonymous = await client.post("/v1/sessions/b/runs", json={"input": "x"})
        assert_problem(anonymous, 401, "unauthorized")
        metrics = (await client.get("/metrics", headers=auth)).text
        assert 'agent_runs_rejected_total{reason="overloaded"} 1.0' in metrics
        served.services.manager.begin_drain()  # draining outranks full
        draining = await client.post("/v1/sessions/b/runs", json={"input": "x"}, headers=auth)
        assert_problem(draining, 503, "draining")
        await served.wait_idle()


async def test_queued_run_waits_then_runs(serve: Serve) -> None:
    async with serve(
        max_concurrent_runs=1, max_queued_runs=4, queue_timeout=10, demo_slow_seconds=0.05
    ) as served:
        client = served.client
        first = await client.post(
            "/v1/sessions/a/runs", json={"input": "slow a b", "background": True}
        )
        second = await client.post(
            "/v1/sessions/b/runs", json={"input": "hello", "background": True}
        )
        assert second.json()["status"] == "queued"
        view = (await client.get(f"/v1/runs/{second.json()['run_id']}")).json()
        assert view["status"] == "queued"
        blocking = await client.post("/v1/sessions/c/runs", json={"input": "x", "stream": False})
        assert blocking.json()["status"] == "completed"
        for started in (first, second):
            assert (await wait_finished(served, started.json()["run_id"]))["status"] == (
                "completed"
            )


async def test_background_queue_timeout_fails_the_run(serve: Serve) -> None:
    async with serve(
        max_concurrent_runs=1, max_queued_runs=1, queue_timeout=0.1, demo_slow_seconds=0.1
    ) as served:
        client = served.client
        await client.post("/v1/sessions/a/runs", json={"input": "slow a b", "background": True})
        late = await client.post("/v1/sessions/b/runs", json={"input": "x", "background": True})
        result = await wait_finished(served, late.json()["run_id"])
        assert result["status"] == "failed"
        assert result["error"]["code"] == "queue_timeout"
        await served.wait_idle()


async def test_per_principal_cap(serve: Serve) -> None:
    async with serve(per_principal_max_runs=1, demo_slow_seconds=0.1) as served:
        client = served.client
        first = await client.post(
            "/v1/sessions/a/runs", json={"input": "slow a b", "background": True}
        )
        assert first.status_code == 202
        capped = await client.post("/v1/sessions/b/runs", json={"input": "x", "stream": False})
        assert_problem(capped, 429, "overloaded")
        await wait_finished(served, first.json()["run_id"])


async def test_draining_refuses_runs(serve: Serve) -> None:
    async with serve() as served:
        served.services.manager.begin_drain()
        ready = await served.client.get("/readyz")
        assert_problem(ready, 503, "draining")
        refused = await served.client.post("/v1/sessions/s/runs", json={"input": "x"})
        assert_problem(refused, 503, "draining")
        assert refused.headers["retry-after"]
        assert (await served.client.get("/healthz")).status_code == 200


async def test_run_options_reach_the_runtime(serve: Serve) -> None:
    async with serve() as served:
        timed_out = await run_blocking(served, "opt", "slow a b c d e", run_timeout=0.05)
        body = timed_out.json()
        assert body["status"] == "failed"
        assert body["error"]["code"] == "run_timeout"
        limited = await run_blocking(served, "opt", "what time is it", max_iterations=1)
        assert limited.json()["error"]["code"] == "max_iterations"
        meta = await run_blocking(served, "opt", "hi", metadata={"ticket": 7})
        view = (await served.client.get(f"/v1/runs/{meta.json()['run_id']}")).json()
        assert view["metadata"] == {"ticket": 7}


async def test_state_survives_a_restart(serve: Serve, make_settings: MakeSettings) -> None:
    async with serve() as served:
        done = (await run_blocking(served, "keep", "remember me")).json()
    settings = make_settings()
    store = await open_store(settings.database_url)
    try:
        await store.create_run(
            RunRecord(
                run_id="run_orphan",
                session_id="keep",
                principal="anonymous",
                agent="default",
                input="x",
                status="running",
            )
        )
    finally:
        await store.close()
    async with serve() as served:
        client = served.client
        run = (await client.get(f"/v1/runs/{done['run_id']}")).json()
        assert run["output"] == {"content": "You said: remember me"}
        assert run["input"] == "remember me"  # from the stored record
        messages = (await client.get("/v1/sessions/keep/messages")).json()["messages"]
        assert len(messages) == 2
        orphan = (await client.get("/v1/runs/run_orphan")).json()
        assert orphan["status"] == "failed"
        assert orphan["error"]["code"] == "worker_lost"


@pytest.mark.parametrize("ttl", [0.0])
async def test_expired_event_log_is_404(serve: Serve, ttl: float) -> None:
    async with serve(event_log_ttl=ttl) as served:
        done = (await run_blocking(served, "old", "hi")).json()

        async def expired() -> bool:
            return not await served.services.bus.events.exists(done["run_id"])

        await wait_until(expired)
        response = await served.client.get(f"/v1/runs/{done['run_id']}/events")
        assert_problem(response, 404, "not_found")
        assert (await served.client.get(f"/v1/runs/{done['run_id']}")).status_code == 200


async def test_debug_endpoint_only_when_enabled(serve: Serve) -> None:
    async with serve(debug_endpoints=False) as served:
        assert_problem(await served.client.get("/debug/state"), 404, "not_found")
    async with serve(debug_endpoints=True) as served:
        state = (await served.client.get("/debug/state")).json()
        assert state["runs"] == 0
        assert state["extensions"]["ConfirmationExtension"] == {"pending": 0, "staged": 0}


async def test_errors_under_the_openai_prefix_take_the_openai_shape(serve: Serve) -> None:
    # the OpenAI SDKs read {"error": {"message", "type", "code"}}; every other path answers
    # problem+json
    async with serve() as served:
        client = served.client
        missing = await client.get("/openai/v1/nothing-here")
        assert missing.status_code == 404
        body = missing.json()
        assert set(body) == {"error"}
        assert body["error"]["type"] == "not_found_error"
        assert body["error"]["code"] == "not_found"
        assert "message" in body["error"]
        assert_problem(await client.get("/v1/nothing-here"), 404, "not_found")
