"""Sessions over HTTP: their own titles (PATCH), the recent list in one request, stopped turns
and replaced turns as GET /v1/sessions/{id}/messages shows them, and the model on each run."""

from __future__ import annotations

from typing import Any

from tests.support.served import Serve, Served, assert_problem, run_blocking
from tests.support.waiting import wait_until


async def titles(served: Served) -> list[tuple[str, Any]]:
    listed = (await served.client.get("/v1/sessions")).json()["sessions"]
    return [(s["session_id"], s["title"]) for s in listed]


async def test_a_session_is_titled_by_its_first_input_and_renamed_by_patch(serve: Serve) -> None:
    async with serve(demo_slow_seconds=5) as served:
        client = served.client
        await run_blocking(served, "t1", "  Plan a\n trip to Oslo  ")
        await run_blocking(served, "t1", "and back")
        # a session whose only run failed still has its title
        await run_blocking(served, "t2", "what time is it", max_iterations=1)
        assert await titles(served) == [("t2", "what time is it"), ("t1", "Plan a trip to Oslo")]

        renamed = await client.patch("/v1/sessions/t1", json={"title": "  Oslo\ttrip "})
        assert renamed.status_code == 200, renamed.text
        assert renamed.json()["title"] == "Oslo trip"
        assert (await client.get("/v1/sessions/t1")).json()["title"] == "Oslo trip"
        # a rename does not move the session up the list
        assert await titles(served) == [("t2", "what time is it"), ("t1", "Oslo trip")]

        for bad in ({"title": ""}, {"title": "   "}, {"title": "x" * 201}, {"name": "x"}, {}):
            assert_problem(await client.patch("/v1/sessions/t1", json=bad), 422, "validation_error")
        assert_problem(
            await client.patch("/v1/sessions/nope", json={"title": "x"}), 404, "not_found"
        )


async def test_titles_are_the_owners_only(serve: Serve) -> None:
    async with serve(api_keys="key-a=alice,key-b=bob") as served:
        alice = {"Authorization": "Bearer key-a"}
        bob = {"Authorization": "Bearer key-b"}
        await run_blocking(served, "mine", "hello", headers=alice)
        answer = await served.client.patch("/v1/sessions/mine", json={"title": "x"}, headers=bob)
        assert_problem(answer, 404, "not_found")
        unauthenticated = await served.client.patch("/v1/sessions/mine", json={"title": "x"})
        assert_problem(unauthenticated, 401, "unauthorized")


async def test_messages_list_the_runs_behind_the_turns(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        first = (await run_blocking(served, "m", "one")).json()
        failed = (await run_blocking(served, "m", "what time is it", max_iterations=1)).json()
        second = (await run_blocking(served, "m", "two")).json()
        body = (await client.get("/v1/sessions/m/messages")).json()
        # a failed run stores no turn, so it is not listed
        assert [r["run_id"] for r in body["runs"]] == [first["run_id"], second["run_id"]]
        assert failed["status"] == "failed"
        run = body["runs"][0]
        assert (run["agent"], run["status"], run["model"]) == ("default", "completed", "demo")
        assert run["usage"]["model"] == "demo" and run["usage"]["output_tokens"] > 0
        assert run["created_at"].endswith("Z") and run["finished_at"].endswith("Z")
        view = (await client.get(f"/v1/runs/{first['run_id']}")).json()
        assert view["model"] == "demo" and view["usage"]["model"] == "demo"
        assert first["usage"]["model"] == "demo"


async def test_a_stopped_turn_is_listed_marked_stopped(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.2) as served:
        client = served.client
        started = await client.post(
            "/v1/sessions/stop/runs", json={"input": "slow a b c d e f g h", "background": True}
        )
        run_id = started.json()["run_id"]

        handle = served.services.manager.local(run_id)
        assert handle is not None
        await wait_until(lambda: handle.seq >= 4)  # run.started and three words
        assert (await client.post(f"/v1/runs/{run_id}/cancel")).status_code == 202

        async def cancelled() -> bool:
            status: str = (await client.get(f"/v1/runs/{run_id}")).json()["status"]
            return status == "cancelled"

        await wait_until(cancelled)
        body = (await client.get("/v1/sessions/stop/messages")).json()
        stored = [(m["role"], m["stopped"]) for m in body["messages"]]
        assert stored == [("user", "cancel_requested"), ("assistant", "cancel_requested")]
        partial = body["messages"][1]["content"]
        assert partial and "You said: slow a b c d e f g h".startswith(partial)
        assert [(r["run_id"], r["status"]) for r in body["runs"]] == [(run_id, "cancelled")]


async def test_regenerate_replaces_the_last_turn(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        first = (await run_blocking(served, "re", "one")).json()
        second = (await run_blocking(served, "re", "two")).json()
        refused = await run_blocking(served, "re", "one again", replaces=first["run_id"])
        assert_problem(refused, 409, "turn_not_latest")
        unknown = await run_blocking(served, "re", "x", replaces="run_nope")
        assert_problem(unknown, 404, "not_found")
        elsewhere = await run_blocking(served, "other", "x", replaces=second["run_id"])
        assert_problem(elsewhere, 404, "not_found")
        again = await run_blocking(served, "re", "two, better", replaces=second["run_id"])
        assert again.status_code == 200, again.text
        body = (await client.get("/v1/sessions/re/messages")).json()
        assert [m["content"] for m in body["messages"]] == [
            "one",
            "You said: one",
            "two, better",
            "You said: two, better",
        ]
        assert [r["run_id"] for r in body["runs"]] == [first["run_id"], again.json()["run_id"]]
        assert (await client.get("/v1/sessions/re")).json()["message_count"] == 4


async def test_a_refused_start_does_not_bring_back_a_deleted_session(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        first = (await run_blocking(served, "gone", "one")).json()
        assert (await client.delete("/v1/sessions/gone")).status_code == 204

        # 404: the turn to replace is unknown (it went with the session)
        unknown = await run_blocking(served, "gone", "again", replaces=first["run_id"])
        assert_problem(unknown, 404, "not_found")
        assert_problem(await client.get("/v1/sessions/gone"), 404, "not_found")

        # 409: the session's lock is held (by a run of another worker, say)
        bus = served.services.bus
        lease = await bus.locks.acquire("gone", f"run_{'0' * 32}", 30.0)
        assert lease is not None
        busy = await run_blocking(served, "gone", "again")
        assert_problem(busy, 409, "session_busy")
        assert busy.json()["active_run_id"] == f"run_{'0' * 32}"
        assert_problem(await client.get("/v1/sessions/gone"), 404, "not_found")
        await bus.locks.release(lease)

        # an admitted run creates it afresh
        admitted = await run_blocking(served, "gone", "again")
        assert admitted.status_code == 200, admitted.text
        view = (await client.get("/v1/sessions/gone")).json()
        assert view["last_run_id"] == admitted.json()["run_id"]
        assert view["title"] == "again" and view["message_count"] == 2
