"""SSE streams in-process, through raw ASGI: framing, disconnects, stalls, pings, replay,
drain."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_runtime import AgentPhase
from tests.support.asgi import ASGIRequest
from tests.support.served import TERMINAL, Serve, Served, assert_well_formed, replay
from tests.support.waiting import wait_until


def stream(served: Served, session: str, text: str, **extra: Any) -> ASGIRequest:
    return served.request("POST", f"/v1/sessions/{session}/runs", {"input": text, **extra})


def has_terminal(request: ASGIRequest) -> bool:
    return any(f.event in TERMINAL for f in request.events())


async def test_stream_framing(serve: Serve) -> None:
    async with serve() as served:
        request = stream(served, "frames", "what time is it")
        await request.finish()
        assert request.status == 200
        assert request.headers["content-type"].startswith("text/event-stream")
        run_id = request.headers["x-run-id"]
        events = request.events()
        assert_well_formed(events, run_id)
        types = [f.event for f in events]
        assert types[0] == "run.started"
        assert {"text.delta", "tool.call.started", "tool.call.completed", "usage"} <= set(types)
        assert types[-1] == "run.completed"
        started = events[0].data
        assert started is not None and started["data"] == {"agent": "default", "model": "demo"}
        completed = events[-1].data
        assert completed is not None
        assert completed["data"]["output"]["content"].startswith("The time is ")
        text = "".join(
            f.data["data"]["delta"] for f in events if f.event == "text.delta" and f.data
        )
        assert text == completed["data"]["output"]["content"]
        assert request.body.endswith(b"\n\n")
        assert await replay(served, run_id) == events
        await served.wait_idle()


async def test_failed_run_streams_run_failed(serve: Serve) -> None:
    async with serve() as served:
        request = stream(served, "fail", "what time is it", max_iterations=1)
        await request.finish()
        events = request.events()
        assert_well_formed(events, request.headers["x-run-id"])
        last = events[-1].data
        assert last is not None and last["type"] == "run.failed"
        assert last["data"]["error"]["code"] == "max_iterations"
        assert last["data"]["error"]["message"]
        assert "Traceback" not in request.body.decode()


async def test_disconnect_cancels_the_run(serve: Serve) -> None:
    # no grace: the disconnect cancels at once (the grace has tests of its own)
    async with serve(demo_slow_seconds=0.2, disconnect_grace=0) as served:
        request = stream(served, "gone", "slow one two three four five six")
        await request.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        run_id = request.headers["x-run-id"]
        request.disconnect()
        await request.finish()
        await served.wait_idle()
        events = await replay(served, run_id)
        assert_well_formed(events, run_id)
        last = events[-1].data
        assert last is not None and last["data"] == {"reason": "client_disconnected"}
        view = (await served.client.get(f"/v1/runs/{run_id}")).json()
        assert view["status"] == "cancelled"
        # the stopped turn stays: the prompt and the words streamed before the disconnect
        stored = (await served.client.get("/v1/sessions/gone/messages")).json()
        said = "".join(
            e.data["data"]["delta"] for e in events if e.data and e.event == "text.delta"
        )
        prompt = "slow one two three four five six"
        assert [(m["role"], m["content"], m["stopped"]) for m in stored["messages"]] == [
            ("user", prompt, "client_disconnected"),
            ("assistant", said, "client_disconnected"),
        ]
        assert said and f"You said: {prompt}".startswith(said) and said != f"You said: {prompt}"
        assert [r["status"] for r in stored["runs"]] == ["cancelled"]


async def test_disconnect_with_continue_keeps_running(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.05) as served:
        request = stream(served, "stay", "slow one two three", on_disconnect="continue")
        await request.wait_for(lambda r: len(r.events()) >= 2)
        run_id = request.headers["x-run-id"]
        request.disconnect()
        await request.finish()
        await served.wait_idle()
        events = await replay(served, run_id)
        assert events[-1].event == "run.completed"


async def test_a_client_that_stops_reading_counts_as_gone(serve: Serve) -> None:
    async with serve(send_timeout=0.2, demo_slow_seconds=0.05) as served:
        request = stream(served, "stall", "slow " + " ".join(["w"] * 50))
        await request.wait_for(lambda r: len(r.events()) >= 2)
        run_id = request.headers["x-run-id"]
        request.stall()
        await request.finish()
        await served.wait_idle()
        events = await replay(served, run_id)
        last = events[-1].data
        assert last is not None and last["data"] == {"reason": "client_disconnected"}


async def test_blocking_client_disconnect_cancels(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.2, disconnect_grace=0) as served:
        request = served.request(
            "POST", "/v1/sessions/blocked/runs", {"input": "slow a b c d e f", "stream": False}
        )

        def running() -> bool:
            return bool(served.services.manager.debug_state()["agent_active_runs"] == 1)

        await wait_until(running)
        (run_id,) = list(served.services.agent.active_runs)
        request.disconnect()
        await request.finish()
        assert request.status is None  # nobody to answer
        await served.wait_idle()
        view = (await served.client.get(f"/v1/runs/{run_id}")).json()
        assert view["status"] == "cancelled"
        events = await replay(served, run_id)
        last = events[-1].data
        assert last is not None and last["data"] == {"reason": "client_disconnected"}


async def test_pings_keep_an_idle_stream_alive(serve: Serve) -> None:
    async with serve(sse_ping=0.05) as served:
        request = stream(served, "idle", "delete a.txt")
        await request.wait_for(lambda r: sum(f.comment == "ping" for f in r.frames()) >= 2)
        run_id = request.headers["x-run-id"]
        assert (await served.client.post(f"/v1/runs/{run_id}/cancel")).status_code == 202
        await request.finish()
        events = request.events()
        assert_well_formed(events, run_id)
        last = events[-1].data
        assert last is not None and last["data"] == {"reason": "cancel_requested"}
        await served.wait_idle()


async def test_resume_from_every_cut(serve: Serve) -> None:
    async with serve() as served:
        request = stream(served, "resume", "some words " * 20)
        await request.finish()
        run_id = request.headers["x-run-id"]
        full = request.events()
        assert_well_formed(full, run_id)
        for cut in range(len(full) + 1):
            header = served.request(
                "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(cut)}
            )
            await header.finish()
            assert full[:cut] + header.events() == full
        beyond = await replay(served, run_id, after=len(full) + 5)
        assert beyond == []


async def test_follow_live_from_a_second_subscriber(serve: Serve) -> None:
    async with serve(demo_slow_seconds=0.05) as served:
        first = stream(served, "two", "slow a b c d e f", on_disconnect="continue")
        await first.wait_for(lambda r: len(r.events()) >= 2)
        run_id = first.headers["x-run-id"]
        cut = len(first.events())
        first.disconnect()
        second = served.request(
            "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(cut)}
        )
        await second.finish()
        await first.finish()
        union = first.events()[:cut] + second.events()
        assert_well_formed(union, run_id)
        assert union[-1].event == "run.completed"


async def test_confirmation_over_streams(serve: Serve) -> None:
    async with serve() as served:
        request = stream(served, "conf", "delete report.pdf")
        await request.wait_for(lambda r: any(f.event == "custom" for f in r.events()))
        run_id = request.headers["x-run-id"]
        custom = next(f for f in request.events() if f.event == "custom").data
        assert custom is not None
        payload = custom["data"]["payload"]
        assert custom["data"]["name"] == "confirmation_requested"
        assert payload["expires_at"].endswith("Z")
        view = (await served.client.get(f"/v1/runs/{run_id}")).json()
        assert view["status"] == "waiting"
        answer = await served.client.post(
            "/external-events",
            json={
                "session_id": "conf",
                "run_id": None,
                "name": "confirmation_response",
                "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
            },
        )
        assert answer.status_code == 202
        await request.finish()
        events = request.events()
        assert_well_formed(events, run_id)
        completed = events[-1].data
        assert completed is not None
        assert "Deleted report.pdf" in completed["data"]["output"]["content"]
        await served.wait_idle()


async def test_cancel_while_waiting_for_a_confirmation(serve: Serve) -> None:
    async with serve() as served:
        request = stream(served, "conf-cancel", "delete x.txt")
        await request.wait_for(lambda r: any(f.event == "custom" for f in r.events()))
        run_id = request.headers["x-run-id"]
        assert (await served.client.post(f"/v1/runs/{run_id}/cancel")).status_code == 202
        await request.finish()
        last = request.events()[-1].data
        assert last is not None and last["data"] == {"reason": "cancel_requested"}
        await served.wait_idle()


async def test_cancel_a_queued_streaming_request(serve: Serve) -> None:
    async with serve(max_concurrent_runs=1, max_queued_runs=2, queue_timeout=10) as served:
        blocker = await served.client.post(
            "/v1/sessions/first/runs", json={"input": "delete a", "background": True}
        )
        queued = stream(served, "second", "hello")

        async def in_queue() -> bool:
            if served.services.admission.queued != 1:
                return False
            # admitted to the queue before its session is created: wait for that too
            summary = await served.client.get("/v1/sessions/second")
            return summary.status_code == 200 and summary.json()["active_run_id"] is not None

        await wait_until(in_queue)
        summary = (await served.client.get("/v1/sessions/second")).json()
        queued_id = summary["active_run_id"]
        view = (await served.client.get(f"/v1/runs/{queued_id}")).json()
        assert view["status"] == "queued"
        assert (await served.client.post(f"/v1/runs/{queued_id}/cancel")).status_code == 202
        await queued.finish()
        events = queued.events()
        assert [f.event for f in events] == ["run.cancelled"]
        assert events[0].data is not None
        assert events[0].data["data"] == {"reason": "cancel_requested"}
        await served.client.post(f"/v1/runs/{blocker.json()['run_id']}/cancel")
        await served.wait_idle()


def _asked(request: Any) -> bool:
    """Whether the run's stream has its confirmation request (the run waits)."""
    return any(
        f.data is not None and f.data.get("data", {}).get("name") == "confirmation_requested"
        for f in request.events()
    )


async def test_drain_lets_short_runs_finish_and_cancels_the_rest(serve: Serve) -> None:
    # short runs need ~0.3 s, long ones ~10 s: a 2 s drain tells them apart with room for a
    # loaded machine. Hand-over off: the rest, the run waiting for an answer among them, is
    # cancelled (with it on, a waiting run is handed over at once: the test below)
    async with serve(drain_timeout=2.0, demo_slow_seconds=0.1, resume_runs=False) as served:
        short = [stream(served, f"short-{i}", "slow a b") for i in range(5)]
        long = [stream(served, f"long-{i}", "slow " + "w " * 100) for i in range(5)]
        waiting = stream(served, "waiting", "delete y.txt")
        everyone = [*short, *long, waiting]
        for request in everyone:
            await request.wait_for(lambda r: len(r.events()) >= 1)
        await waiting.wait_for(_asked)  # waiting at the drain's start, or about to
        manager = served.services.manager
        drain = asyncio.ensure_future(manager.drain(2.0))
        for request in everyone:
            await request.finish()
        await drain
        for request in short:
            assert request.events()[-1].event == "run.completed"
        for request in [*long, waiting]:
            last = request.events()[-1].data
            assert last is not None and last["data"] == {"reason": "shutdown"}
        for request in everyone:
            assert_well_formed(request.events(), request.headers["x-run-id"])
            assert request.complete
        await served.wait_idle()


async def test_drain_hands_a_waiting_run_over_at_once(serve: Serve) -> None:
    # a run waiting for a person may wait for hours: the drain does not wait for it. Its
    # stream ends without a terminal event, and its checkpoint says it was handed over (an
    # answer after the restart resumes it)
    async with serve(drain_timeout=5.0) as served:
        waiting = stream(served, "waiting", "delete y.txt")
        await waiting.wait_for(_asked)
        run_id = waiting.headers["x-run-id"]
        active = served.services.agent.active_runs
        # the run says it waits once its question is out: a moment later it does
        await wait_until(lambda: run_id in active and active[run_id].phase is AgentPhase.WAITING)
        started = asyncio.get_running_loop().time()
        await served.services.manager.drain(5.0)
        assert asyncio.get_running_loop().time() - started < 4.0  # not the drain's budget
        await waiting.finish()
        assert waiting.events()[-1].event not in TERMINAL
        assert _asked(waiting)
        checkpoint = await served.services.store.get_checkpoint(run_id)
        assert checkpoint is not None and checkpoint.handover == "shutdown"


async def test_many_disconnects_leave_nothing_behind(serve: Serve) -> None:
    # no grace: each disconnect cancels at once (with one, a run may finish first)
    async with serve(demo_slow_seconds=0.05, disconnect_grace=0) as served:
        requests = [stream(served, f"many-{i}", "slow " + "w " * 40) for i in range(50)]
        for request in requests:
            await request.wait_for(lambda r: any(f.event == "text.delta" for f in r.events()))
        for request in requests:
            request.disconnect()
        for request in requests:
            await request.finish()
        state = await served.wait_idle()
        assert state["runs"] == 0
        for request in requests:
            events = await replay(served, request.headers["x-run-id"])
            last = events[-1].data
            assert last is not None and last["data"] == {"reason": "client_disconnected"}


async def test_drain_refuses_queued_requests(serve: Serve) -> None:
    # resume off: the waiting holder is cancelled at the drain, not parked for the restart
    async with serve(
        max_concurrent_runs=1, max_queued_runs=4, queue_timeout=10, resume_runs=False
    ) as served:
        holder = stream(served, "holder", "delete h.txt")
        await holder.wait_for(lambda r: any(f.event == "custom" for f in r.events()))
        queued_stream = stream(served, "q1", "hello")
        queued_background = await served.client.post(
            "/v1/sessions/q2/runs", json={"input": "hello", "background": True}
        )
        assert queued_background.json()["status"] == "queued"

        def two_queued() -> bool:
            return served.services.admission.queued == 2

        await wait_until(two_queued)
        drain = asyncio.ensure_future(served.services.manager.drain(0.2))
        await queued_stream.finish()
        assert queued_stream.status == 503
        assert queued_stream.json()["code"] == "draining"
        await holder.finish()
        await drain
        last = holder.events()[-1].data
        assert last is not None and last["data"] == {"reason": "shutdown"}
        background = (
            await served.client.get(f"/v1/runs/{queued_background.json()['run_id']}")
        ).json()
        assert background["status"] == "cancelled"
        events = await replay(served, background["run_id"])
        assert [f.event for f in events] == ["run.cancelled"]
        assert events[0].data is not None
        assert events[0].data["data"] == {"reason": "shutdown"}
        await served.wait_idle()
