"""Idempotent run starts (``Idempotency-Key``), the disconnect grace, clean ends (204 and
``retry:``), in-process against the app with its lifespan running."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.runs.idempotency import check_key
from tests.support.asgi import ASGIRequest, Frame
from tests.support.served import Serve, Served, assert_problem, assert_well_formed, replay
from tests.support.waiting import wait_until

TERMINAL = {"run.completed", "run.failed", "run.cancelled"}


def start(
    served: Served, session: str, body: dict[str, Any], key: str, **headers: str
) -> ASGIRequest:
    return served.request(
        "POST", f"/v1/sessions/{session}/runs", body, headers={"Idempotency-Key": key, **headers}
    )


async def post(
    client: httpx.AsyncClient, session: str, body: dict[str, Any], key: str | None = None
) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await client.post(f"/v1/sessions/{session}/runs", json=body, headers=headers)


async def user_turns(served: Served, session: str) -> list[str]:
    stored = (await served.client.get(f"/v1/sessions/{session}/messages")).json()
    return [m["content"] for m in stored["messages"] if m["role"] == "user"]


async def test_a_streamed_repeat_replays_the_first_run(serve: Serve) -> None:
    async with serve() as served:
        body = {"input": "hello there"}
        first = start(served, "s1", body, "k-1")
        await first.finish()
        run_id = first.headers["x-run-id"]
        assert "idempotent-replayed" not in first.headers
        repeat = start(served, "s1", body, "k-1")
        await repeat.finish()
        assert repeat.status == 200
        assert repeat.headers["x-run-id"] == run_id
        assert repeat.headers["idempotent-replayed"] == "true"
        assert repeat.events() == first.events()
        assert_well_formed(repeat.events(), run_id)
        # from the repeat's own Last-Event-ID on
        later = start(served, "s1", body, "k-1", **{"Last-Event-ID": "3"})
        await later.finish()
        assert later.events() == first.events()[3:]
        assert await user_turns(served, "s1") == ["hello there"]
        await served.wait_idle()


async def test_a_repeat_at_the_terminal_event_gets_204(serve: Serve) -> None:
    async with serve() as served:
        first = start(served, "s204", {"input": "hi"}, "k")
        await first.finish()
        last = first.events()[-1].id
        assert last is not None
        repeat = start(served, "s204", {"input": "hi"}, "k", **{"Last-Event-ID": str(last)})
        await repeat.finish()
        assert repeat.status == 204
        assert repeat.body == b""
        assert repeat.headers["idempotent-replayed"] == "true"
        run_id = first.headers["x-run-id"]
        reader = served.request(
            "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(last)}
        )
        await reader.finish()
        assert reader.status == 204
        past = served.request("GET", f"/v1/runs/{run_id}/events", query=f"after={last + 5}")
        await past.finish()
        assert past.status == 204
        # one short of the end: the terminal event, then the end
        before = served.request("GET", f"/v1/runs/{run_id}/events", query=f"after={last - 1}")
        await before.finish()
        assert before.status == 200
        assert [f.event for f in before.events()] == ["run.completed"]


async def test_every_stream_starts_with_a_retry_field(serve: Serve) -> None:
    async with serve(sse_retry_ms=2500) as served:
        first = served.request("POST", "/v1/sessions/retry/runs", {"input": "hi"})
        await first.finish()
        assert first.body.startswith(b"retry: 2500\nid: 1\n")
        reader = served.request("GET", f"/v1/runs/{first.headers['x-run-id']}/events")
        await reader.finish()
        assert reader.body.startswith(b"retry: 2500\n")
        # the field joins the first event: no empty event before it
        assert reader.events() == first.events()
        assert len(reader.frames()) == len(reader.events())


async def test_background_and_blocking_repeats(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        body = {"input": "slow a b c", "background": True}
        first = await post(client, "bg", body, "bg-key")
        assert first.status_code == 202
        repeat = await post(client, "bg", body, "bg-key")
        assert repeat.status_code == 202
        assert repeat.headers["idempotent-replayed"] == "true"
        assert repeat.headers["x-run-id"] == first.headers["x-run-id"]
        assert repeat.json()["run_id"] == first.json()["run_id"]
        assert repeat.headers["location"] == first.headers["location"]

        blocking = {"input": "what time is it", "stream": False}
        answer = await post(client, "json", blocking, "json-key")
        again = await post(client, "json", blocking, "json-key")
        assert again.status_code == 200
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == answer.json()
        assert await user_turns(served, "json") == ["what time is it"]
        await served.wait_idle()


async def test_the_same_key_for_another_request_is_refused(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        body = {"input": "one", "stream": False}
        assert (await post(client, "a", body, "shared")).status_code == 200
        other_body = await post(client, "a", {"input": "two", "stream": False}, "shared")
        assert_problem(other_body, 422, "idempotency_key_reused")
        other_session = await post(client, "b", body, "shared")
        assert_problem(other_session, 422, "idempotency_key_reused")
        # the default of a field is the same request as the field left out
        same = await post(client, "a", {**body, "agent": "default"}, "shared")
        assert same.status_code == 200
        assert same.headers["idempotent-replayed"] == "true"
        assert await user_turns(served, "a") == ["one"]
        assert (await client.get("/v1/sessions/b")).status_code == 404


async def test_keys_are_checked(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        body = {"input": "x", "stream": False}
        assert_problem(await post(client, "k", body, "a" * 256), 422, "validation_error")
        assert_problem(await post(client, "k", body, "tab\there"), 422, "validation_error")
        assert (await post(client, "k", body, "~" * 255)).status_code == 200
    assert check_key(" !~") == " !~"


async def test_keys_are_per_principal(serve: Serve) -> None:
    async with serve(api_keys="ka=alice,kb=bob") as served:
        client = served.client
        body = {"input": "mine", "stream": False}
        alice = await client.post(
            "/v1/sessions/alice-s/runs",
            json=body,
            headers={"Authorization": "Bearer ka", "Idempotency-Key": "same"},
        )
        assert alice.status_code == 200
        bob = await client.post(
            "/v1/sessions/bob-s/runs",
            json=body,
            headers={"Authorization": "Bearer kb", "Idempotency-Key": "same"},
        )
        # bob's key is his own: no reuse across principals, a run of his own
        assert bob.status_code == 200
        assert "idempotent-replayed" not in bob.headers
        assert bob.json()["run_id"] != alice.json()["run_id"]
        # bob repeating alice's exact request (her session): her session is not his (404),
        # never her run's answer
        stolen = await client.post(
            "/v1/sessions/alice-s/runs",
            json=body,
            headers={"Authorization": "Bearer kb", "Idempotency-Key": "alice-only"},
        )
        assert_problem(stolen, 404, "not_found")


async def test_a_key_expires(serve: Serve) -> None:
    async with serve(idempotency_ttl=0.3) as served:
        client = served.client
        body = {"input": "again", "stream": False}
        first = (await post(client, "exp", body, "short")).json()["run_id"]

        async def fresh() -> bool:
            answer = await post(client, "exp", body, "short")
            return bool(answer.json()["run_id"] != first)

        await wait_until(fresh, within=20)
        assert await user_turns(served, "exp") == ["again", "again"]


async def test_a_failed_start_frees_its_key(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        busy = await post(client, "busy", {"input": "delete report.txt", "background": True})
        holder = busy.json()["run_id"]
        body = {"input": "after", "background": True}
        assert_problem(await post(client, "busy", body, "retry-me"), 409, "session_busy")
        await client.post(f"/v1/runs/{holder}/cancel")

        async def started() -> bool:
            return (await post(client, "busy", body, "retry-me")).status_code == 202

        await wait_until(started)
        await served.wait_idle()


async def test_racing_repeats_start_one_run(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        body = {"input": "slow race", "background": True}
        answers = await asyncio.gather(
            *(post(client, "race", body, "race-key") for _ in range(200))
        )
        # on a loaded machine a repeat may outwait the first's admission: it is told to come
        # back (409 in flight, Retry-After), as a client would, and then gets the same run
        for _ in range(20):
            waiting = [i for i, a in enumerate(answers) if a.status_code == 409]
            if not waiting:
                break
            assert {answers[i].json()["code"] for i in waiting} == {"idempotency_key_in_flight"}
            for i in waiting:
                answers[i] = await post(client, "race", body, "race-key")
        assert {a.status_code for a in answers} == {202}
        assert len({a.json()["run_id"] for a in answers}) == 1
        assert sum("idempotent-replayed" in a.headers for a in answers) == 199
        await served.wait_idle()
        assert await user_turns(served, "race") == ["slow race"]


# --- the disconnect grace -------------------------------------------------------------------


def text_of(events: list[Frame]) -> str:
    return "".join(
        f.data["data"]["delta"] for f in events if f.event == "text.delta" and f.data is not None
    )


async def test_a_repeat_within_the_grace_keeps_the_run(serve: Serve) -> None:
    # a long grace: the repeat certainly comes within it, however loaded the machine
    async with serve(demo_slow_seconds=0.05, disconnect_grace=60) as served:
        body = {"input": "slow one two three four five six seven eight"}
        first = start(served, "cut", body, "cut-key")
        await first.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        run_id = first.headers["x-run-id"]
        first.disconnect()
        await first.finish()
        seen = first.events()
        repeat = start(served, "cut", body, "cut-key", **{"Last-Event-ID": str(seen[-1].id)})
        await repeat.finish(within=30)
        assert repeat.headers["x-run-id"] == run_id
        whole = seen + repeat.events()
        assert_well_formed(whole, run_id)
        assert whole == await replay(served, run_id)
        assert whole[-1].event == "run.completed"
        assert await user_turns(served, "cut") == [body["input"]]
        await served.wait_idle()
        assert served.services.manager.debug_state()["grace_timers"] == 0


async def test_a_reader_within_the_grace_keeps_the_run(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.05, disconnect_grace=60) as served:
        first = served.request("POST", "/v1/sessions/watch/runs", {"input": "slow a b c d e f"})
        await first.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        run_id = first.headers["x-run-id"]
        first.disconnect()
        await first.finish()
        reader = served.request("GET", f"/v1/runs/{run_id}/events")
        await reader.finish(within=30)
        assert reader.events()[-1].event == "run.completed"
        await served.wait_idle()


async def test_without_a_reader_the_grace_ends_in_a_cancel(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.2, disconnect_grace=0.2) as served:
        first = served.request(
            "POST", "/v1/sessions/left/runs", {"input": "slow " + " ".join(["w"] * 200)}
        )
        await first.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        run_id = first.headers["x-run-id"]
        first.disconnect()
        await first.finish()

        async def cancelled() -> bool:
            view = (await served.client.get(f"/v1/runs/{run_id}")).json()
            return bool(view["status"] == "cancelled")

        await wait_until(cancelled, within=30)
        await served.wait_idle()
        events = await replay(served, run_id)
        assert events[-1].data is not None
        assert events[-1].data["data"] == {"reason": "client_disconnected"}


async def test_a_reader_before_the_disconnect_is_noticed_keeps_the_run(serve: Serve) -> None:
    # a retry may attach before the server notices that the first connection broke
    async with serve(demo_slow_seconds=0.05, disconnect_grace=60) as served:
        first = served.request("POST", "/v1/sessions/early/runs", {"input": "slow a b c d e f"})
        await first.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        run_id = first.headers["x-run-id"]
        reader = served.request("GET", f"/v1/runs/{run_id}/events")
        await reader.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        first.disconnect()
        await first.finish()
        await reader.finish(within=30)
        assert reader.events()[-1].event == "run.completed"
        await served.wait_idle()
