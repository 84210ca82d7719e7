"""Durable runs across real worker processes: a run outlives the worker that started it.

Two workers share Redis and PostgreSQL (``start_cluster``); one worker runs on SQLite and the
in-process bus (``start_server``). A worker is killed (SIGKILL) or stopped (SIGTERM) while a
run streams, runs a tool or waits for an approval; the run goes on from its last checkpoint,
on the other worker or after the restart, and its readers see one stream: seq rising by one,
one ``run.resumed``, one terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cluster import StartCluster
from tests.support.runs import (
    SLOW,
    approve,
    events_so_far,
    follow,
    is_request,
    kill,
    new_session,
    resumed,
    start_background,
)
from tests.support.server import launch
from tests.support.sse import Event, assert_well_formed, open_stream
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


async def follow_until(
    client: httpx.AsyncClient, run_id: str, count: int, then: Any
) -> list[Event]:
    """Read the run's events; after ``count`` of them call ``then()``, read on to the end."""
    followed: list[Event] = []
    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (response, stream):
        assert response.status_code == 200
        async for event in stream:
            followed.append(event)
            if len(followed) == count:
                then()
    return followed


async def test_a_run_killed_mid_stream_completes_on_the_other_worker(
    start_cluster: StartCluster,
) -> None:
    victim, survivor = start_cluster(2)
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs:
        run_id = await start_background(cv, session, SLOW)
        # a reader on the survivor, cut at the kill: one stream across the hand-over
        events = await follow_until(cs, run_id, 4, lambda: kill(victim))
        assert_well_formed(events, run_id)
        (marker,) = resumed(events)
        assert marker.data["data"]["reason"] == "worker_lost"
        assert 0 <= marker.data["data"]["from_seq"] < marker.id
        assert events[-1].type == "run.completed"
        words = events[-1].data["data"]["output"]["content"].split()
        assert words == ["You", "said:", *SLOW.split()]
        # a reader resuming with Last-Event-ID on the survivor gets the same rest
        rest = await follow(cs, run_id, after=2)
        assert rest == events[2:]
        messages = (await cs.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]  # stored once
        view = (await cs.get(f"/v1/runs/{run_id}")).json()
        assert view["status"] == "completed"


def _tool_config(directory: Path) -> Path:
    config = directory / "agents.toml"
    config.write_text(
        "[agents.default]\n"
        'model = "python:tests.fakes.config_models:tool_caller"\n'
        "tools = [\n"
        '  "tests.fakes.durable_tools:once_effect",\n'
        '  "tests.fakes.durable_tools:idempotent_effect",\n'
        "]\n"
        'idempotent_tools = ["idempotent_effect"]\n',
        encoding="utf-8",
    )
    return config


@pytest.mark.parametrize("tool", ["once_effect", "idempotent_effect"])
async def test_a_tool_call_cut_by_a_kill_runs_again_only_if_idempotent(
    start_cluster: StartCluster, tmp_path: Path, tool: str
) -> None:
    effects = tmp_path / "effects.txt"
    effects.touch()
    common = {
        "AGENT_CONFIG": str(_tool_config(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "DURABLE_EFFECTS": str(effects),
    }
    # the first worker's tool call takes a minute: the kill lands while it runs
    (victim,) = start_cluster(1, {**common, "DURABLE_WORKER": "A", "DURABLE_TOOL_SECONDS": "60"})
    (survivor,) = start_cluster(1, {**common, "DURABLE_WORKER": "B"})
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs:
        run_id = await start_background(cv, session, f'call {tool} {{"text": "x"}}')

        async def started() -> bool:
            return effects.read_text(encoding="utf-8").count("\n") >= 1

        await wait_for(started)
        kill(victim)
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        assert len(resumed(events)) == 1
        output = events[-1].data["data"]["output"]["content"]
        lines = effects.read_text(encoding="utf-8").splitlines()
        if tool == "once_effect":
            # not run again: the model is told the outcome is unknown
            assert lines == ["A once_effect x"]
            assert output.startswith("once_effect failed:"), output
            assert "unknown" in output, output
        else:
            assert lines == ["A idempotent_effect x", "B idempotent_effect x"]
            assert output == "idempotent_effect -> recorded x"


async def test_a_waiting_run_is_parked_at_sigterm_and_answered_on_the_other_worker(
    start_cluster: StartCluster,
) -> None:
    leaving, staying = start_cluster(2)
    session = new_session()
    async with leaving.client() as cl, staying.client() as cs:
        run_id = await start_background(cl, session, "delete plans.md")

        async def request() -> dict[str, Any] | None:
            for event in await events_so_far(cs, run_id):
                if (
                    event.type == "custom"
                    and event.data["data"]["name"] == "confirmation_requested"
                ):
                    payload: dict[str, Any] = event.data["data"]["payload"]
                    return payload
            return None

        payload = await wait_for(request)
        seen = len(await events_so_far(cs, run_id))
        leaving.signal(signal.SIGTERM)
        # parked at once: the worker need not wait out its drain for a person's answer
        assert leaving.wait(15) == 0
        assert (await cs.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting"
        answer = {
            "session_id": session,
            "run_id": run_id,
            "name": payload["response_event"],
            "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
        }

        async def accepted() -> bool:
            response = await cs.post("/external-events", json=answer)
            # between owners: post it again (never a 409, which a front end takes as final)
            assert response.status_code in (202, 503), response.text
            return response.status_code == 202

        await wait_for(accepted)
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        (marker,) = resumed(events)
        assert marker.id > seen and marker.data["data"]["reason"] == "shutdown"
        asked = [
            e
            for e in events
            if e.type == "custom" and e.data["data"]["name"] == "confirmation_requested"
        ]
        assert len(asked) == 1  # asked once, answered once
        assert events[-1].type == "run.completed"
        assert "Deleted plans.md" in events[-1].data["data"]["output"]["content"]


async def test_a_parked_run_cancelled_on_the_other_worker_ends_cancelled(
    start_cluster: StartCluster,
) -> None:
    leaving, staying = start_cluster(2)
    session = new_session()
    async with leaving.client() as cl, staying.client() as cs:
        run_id = await start_background(cl, session, "delete plans.md")

        async def asked() -> bool:
            return any(
                e.type == "custom" and e.data["data"]["name"] == "confirmation_requested"
                for e in await events_so_far(cs, run_id)
            )

        await wait_for(asked)
        leaving.signal(signal.SIGTERM)
        assert leaving.wait(15) == 0
        assert (await cs.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting"
        cancelled = await cs.post(f"/v1/runs/{run_id}/cancel")
        assert cancelled.status_code in (200, 202), cancelled.text
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        assert events[-1].type == "run.cancelled"
        assert events[-1].data["data"]["reason"] == "cancel_requested"

        async def stored() -> bool:
            return bool((await cs.get(f"/v1/runs/{run_id}")).json()["status"] == "cancelled")

        await wait_for(stored)
        # nothing brings it back: the next run of the session starts at once
        again = await cs.post(
            f"/v1/sessions/{session}/runs", json={"input": "hello", "stream": False}
        )
        assert again.status_code == 200, again.text


async def test_past_max_resumes_a_killed_worker_s_run_ends_worker_lost(
    start_cluster: StartCluster,
) -> None:
    victim, survivor = start_cluster(2, {"AGENT_MAX_RESUMES": "0"})
    async with victim.client() as cv, survivor.client() as cs:
        run_id = await start_background(cv, new_session(), SLOW)
        events = await follow_until(cs, run_id, 4, lambda: kill(victim))
        assert_well_formed(events, run_id)
        assert resumed(events) == []
        assert events[-1].type == "run.failed"
        assert events[-1].data["data"]["error"]["code"] == "worker_lost"


@pytest.mark.parametrize("how", ["kill", "sigterm"])
async def test_one_worker_on_sqlite_resumes_its_runs_after_a_restart(
    tmp_path: Path, how: str
) -> None:
    directory = tmp_path / "server"
    env = {"AGENT_DRAIN_TIMEOUT": "0.2"}
    server = launch(directory, env)
    try:
        session = new_session()
        async with server.client() as client:
            streaming = await start_background(client, session, SLOW)
            waiting = await start_background(client, new_session(), "delete notes.md")

            async def ready() -> bool:
                one = (await client.get(f"/v1/runs/{streaming}")).json()
                two = (await client.get(f"/v1/runs/{waiting}")).json()
                return bool(one["status"] == "running" and two["status"] == "waiting")

            await wait_for(ready)
        if how == "kill":
            kill(server)
        else:
            server.signal(signal.SIGTERM)
            assert server.wait(15) == 0
        server = launch(directory, env)
        async with server.client() as client:
            if how == "kill":
                events = await follow(client, streaming)
                assert events[0].type == "run.resumed"
                assert events[0].data["data"]["reason"] == "worker_lost"
                first = events[0].id
                assert [e.id for e in events] == list(range(first, first + len(events)))
                assert events[-1].type == "run.completed"
            else:
                # a streaming run's readers are on the stopping process (in-process bus): it
                # is cancelled there, not handed over
                view = (await client.get(f"/v1/runs/{streaming}")).json()
                assert view["status"] == "cancelled"
            asked = await events_so_far(client, waiting)
            request = [
                e
                for e in asked
                if e.type == "custom" and e.data["data"]["name"] == "confirmation_requested"
            ]
            payload = request[-1].data["data"]["payload"]
            answer = await client.post(
                "/external-events",
                json={
                    "session_id": request[-1].data["session_id"],
                    "run_id": waiting,
                    "name": payload["response_event"],
                    "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
                },
            )
            assert answer.status_code == 202, answer.text
            rest = await follow(client, waiting, after=request[-1].id)
            assert rest[-1].type == "run.completed"
            assert "Deleted notes.md" in rest[-1].data["data"]["output"]["content"]
    finally:
        server.stop()


async def test_a_reader_of_a_run_cut_by_a_crash_of_the_only_worker_reads_it_whole(
    tmp_path: Path,
) -> None:
    # The in-process log is lost with the process; the resumed run's new log goes on from its
    # checkpoint's seq, below the seqs the reader saw. Reconnecting with the last of them, the
    # reader gets the new log from its run.resumed, and what it keeps plus what follows is
    # the answer, every word once.
    directory = tmp_path / "server"
    server = launch(directory, {})
    try:
        async with server.client() as client:
            run_id = await start_background(client, new_session(), SLOW)
            seen: list[Event] = []
            async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (_, stream):
                async for event in stream:
                    seen.append(event)
                    if len(seen) == 6:
                        break
        kill(server)
        server = launch(directory, {})
        async with server.client() as client:
            rest = await follow(client, run_id, after=seen[-1].id)
        marker = rest[0]
        assert marker.type == "run.resumed"
        assert marker.id <= seen[-1].id  # the new log's numbering, below the reader's cursor
        from_seq = marker.data["data"]["from_seq"]
        kept = [e for e in seen if e.id <= from_seq and e.type == "text.delta"]
        after = [e for e in rest if e.type == "text.delta"]
        words = "".join(e.data["data"]["delta"] for e in kept + after).split()
        assert words == ["You", "said:", *SLOW.split()]
        assert [e.id for e in rest] == list(range(marker.id, marker.id + len(rest)))
        assert rest[-1].type == "run.completed"
    finally:
        server.stop()


async def test_twenty_waiting_runs_survive_a_restart_on_sqlite(tmp_path: Path) -> None:
    directory = tmp_path / "server"
    server = launch(directory, {})
    try:
        async with server.client() as client:
            runs = [
                await start_background(client, new_session(), f"delete file{i}.md")
                for i in range(20)
            ]

            async def all_waiting() -> bool:
                for run_id in runs:
                    if (await client.get(f"/v1/runs/{run_id}")).json()["status"] != "waiting":
                        return False
                return True

            await wait_for(all_waiting, within=60)
        server.signal(signal.SIGTERM)
        assert server.wait(15) == 0  # parked at once, not drained
        server = launch(directory, {})
        async with server.client() as client:
            for index, run_id in enumerate(runs):

                async def request(run_id: str = run_id) -> Event | None:
                    asked = [
                        e
                        for e in await events_so_far(client, run_id)
                        if e.type == "custom" and e.data["data"]["name"] == "confirmation_requested"
                    ]
                    return asked[-1] if asked else None

                asked = await wait_for(request, within=30)
                answer = await approve(client, asked)
                assert answer.status_code == 202, answer.text
                rest = await follow(client, run_id, after=asked.id)
                assert rest[-1].type == "run.completed"
                assert f"Deleted file{index}.md" in rest[-1].data["data"]["output"]["content"]
    finally:
        server.stop()


async def test_a_confirmation_that_expires_while_parked_is_expired_when_resumed(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "server"
    env = {"AGENT_CONFIRMATION_TIMEOUT": "3"}
    server = launch(directory, env)
    try:
        async with server.client() as client:
            run_id = await start_background(client, new_session(), "delete old.md")

            async def request() -> Event | None:
                for event in await events_so_far(client, run_id):
                    if (
                        event.type == "custom"
                        and event.data["data"]["name"] == "confirmation_requested"
                    ):
                        return event
                return None

            asked = await wait_for(request)
        server.signal(signal.SIGTERM)
        assert server.wait(15) == 0  # parked
        expires = datetime.fromisoformat(asked.data["data"]["payload"]["expires_at"])

        async def expired() -> bool:
            return datetime.now(UTC) > expires

        # nobody can answer while no worker runs: the request's own deadline passes
        await wait_for(expired, within=10)
        server = launch(directory, env)
        async with server.client() as client:
            rest = await follow(client, run_id, after=asked.id)
            assert rest[-1].type == "run.completed"
            outcomes = [
                e.data["data"]["payload"]["outcome"]
                for e in rest
                if e.type == "custom" and e.data["data"]["name"] == "confirmation_resolved"
            ]
            assert outcomes == ["expired"]
            # the restarted worker did not ask again with a fresh deadline
            assert not [
                e
                for e in rest
                if e.type == "custom" and e.data["data"]["name"] == "confirmation_requested"
            ]
            late = await client.post(
                "/external-events",
                json={
                    "session_id": asked.data["session_id"],
                    "run_id": run_id,
                    "name": asked.data["data"]["payload"]["response_event"],
                    "payload": {
                        "tool_call_id": asked.data["data"]["payload"]["tool_call_id"],
                        "approved": True,
                    },
                },
            )
            assert late.status_code == 409, late.text
            assert "Deleted old.md" not in rest[-1].data["data"]["output"]["content"]
    finally:
        server.stop()


async def test_a_resumed_run_keeps_its_request_s_deadline(tmp_path: Path) -> None:
    directory = tmp_path / "server"
    server = launch(directory, {})
    try:
        async with server.client() as client:
            started = await client.post(
                f"/v1/sessions/{new_session()}/runs",
                json={"input": "delete soon.md", "background": True, "run_timeout": 4},
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]

            async def waiting() -> dict[str, Any] | None:
                view: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
                return view if view["status"] == "waiting" else None

            view = await wait_for(waiting)
        server.signal(signal.SIGTERM)
        assert server.wait(15) == 0  # parked, with 4 s from its start to finish
        deadline = datetime.fromisoformat(view["started_at"]) + timedelta(seconds=4)

        async def past() -> bool:
            return datetime.now(UTC) > deadline

        await wait_for(past, within=10)
        server = launch(directory, {})
        async with server.client() as client:
            events = await follow(client, run_id)
            # the log of the in-process bus begins again after the checkpoint's seq
            first = events[0].id
            assert [e.id for e in events] == list(range(first, first + len(events)))
            assert events[0].type == "run.resumed"
            # the deadline counts from the run's start, across the restart: not a fresh one,
            # and not none (the confirmation alone would wait 300 s)
            assert events[-1].type == "run.failed"
            assert events[-1].data["data"]["error"]["code"] == "run_timeout"
    finally:
        server.stop()


async def test_a_streaming_run_is_handed_over_at_the_drain_timeout(
    start_cluster: StartCluster,
) -> None:
    leaving, staying = start_cluster(2)  # AGENT_DRAIN_TIMEOUT=1: the run needs ~6 s
    session = new_session()
    async with leaving.client() as cl, staying.client() as cs:
        run_id = await start_background(cl, session, SLOW)
        # a reader on the stopping worker: its stream is cut once the drain is over, and it
        # reads on from the other worker after the last event it saw
        first: list[Event] = []
        with pytest.raises(httpx.RemoteProtocolError):
            async with open_stream(cl, "GET", f"/v1/runs/{run_id}/events") as (response, stream):
                assert response.status_code == 200
                async for event in stream:
                    first.append(event)
                    if len(first) == 3:
                        leaving.signal(signal.SIGTERM)
        assert len(first) > 3  # it streamed on while the drain waited for the run
        assert not resumed(first)
        assert first[-1].type not in ("run.completed", "run.failed", "run.cancelled")
        assert leaving.wait(15) == 0
        rest = await follow(cs, run_id, after=first[-1].id)
        events = first + rest
        assert_well_formed(events, run_id)
        (marker,) = resumed(events)
        assert marker.data["data"]["reason"] == "shutdown"
        assert events[-1].type == "run.completed"
        words = events[-1].data["data"]["output"]["content"].split()
        assert words == ["You", "said:", *SLOW.split()]
        messages = (await cs.get(f"/v1/sessions/{session}/messages")).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]


async def test_runs_found_at_a_restart_with_too_few_slots_wait_for_one(tmp_path: Path) -> None:
    directory = tmp_path / "server"
    server = launch(directory, {"AGENT_MAX_CONCURRENT_RUNS": "4"})
    try:
        async with server.client() as client:
            runs = [
                await start_background(client, new_session(), f"delete slot{i}.md")
                for i in range(4)
            ]

            async def all_waiting() -> bool:
                views = [(await client.get(f"/v1/runs/{r}")).json() for r in runs]
                return all(view["status"] == "waiting" for view in views)

            await wait_for(all_waiting)
        server.signal(signal.SIGTERM)
        assert server.wait(15) == 0
        # restarted with room for two: two resume now, the others once a slot frees
        server = launch(directory, {"AGENT_MAX_CONCURRENT_RUNS": "2", "AGENT_MAX_QUEUED_RUNS": "0"})
        async with server.client() as client:
            for index, run_id in enumerate(runs):

                async def request(run_id: str = run_id) -> Event | None:
                    asked = [e for e in await events_so_far(client, run_id) if is_request(e)]
                    return asked[-1] if asked else None

                asked = await wait_for(request, within=30)
                answer = await approve(client, asked)
                assert answer.status_code == 202, answer.text
                rest = await follow(client, run_id, after=asked.id)
                assert rest[-1].type == "run.completed"  # not worker_lost for want of a slot
                assert f"Deleted slot{index}.md" in rest[-1].data["data"]["output"]["content"]
    finally:
        server.stop()


@pytest.mark.parametrize("comes_back", [False, True])
async def test_a_streamed_run_resumed_without_its_client_is_cancelled(
    start_cluster: StartCluster, comes_back: bool
) -> None:
    # readers renew their mark every second (the ping): a run resumed on the survivor is
    # cancelled ~11 s after the resume unless a reader is found; the run needs ~20 s
    victim, survivor = start_cluster(2, {"AGENT_SSE_PING": "1"})
    session = new_session()
    text = " ".join(["slow"] + ["w"] * 200)
    run_id = ""
    async with victim.client() as cv, survivor.client() as cs:
        # a streamed run that is cancelled once its client leaves (on_disconnect=cancel, the
        # default): its client reads it from the worker that dies
        with contextlib.suppress(httpx.HTTPError):
            async with open_stream(
                cv, "POST", f"/v1/sessions/{session}/runs", json={"input": text}
            ) as (response, stream):
                assert response.status_code == 200
                async for event in stream:
                    run_id = event.data["run_id"]
                    if event.id == 3:
                        kill(victim)
        assert run_id
        if comes_back:
            # the client reads on from the survivor: the run goes on to its end
            events = await follow(cs, run_id, after=3)
            assert events[-1].type == "run.completed"
            assert len(resumed(events)) == 1
            return

        async def ended() -> dict[str, Any] | None:
            view: dict[str, Any] = (await cs.get(f"/v1/runs/{run_id}")).json()
            return view if view["status"] in ("cancelled", "completed", "failed") else None

        view = await wait_for(ended, within=60)
        # resumed, then cancelled for nobody reading it, instead of run to its end
        assert view["status"] == "cancelled", view
        events = await follow(cs, run_id)
        assert_well_formed(events, run_id)
        assert len(resumed(events)) == 1
        assert events[-1].type == "run.cancelled"
        assert events[-1].data["data"]["reason"] == "client_disconnected"


async def test_a_waiting_streamed_run_resumed_without_a_reader_still_waits(
    start_cluster: StartCluster,
) -> None:
    # an AI SDK or AG-UI client's stream ends at the request for an answer, and the person
    # answers later: a run resumed while it waits is not cancelled for want of a reader
    victim, survivor = start_cluster(2, {"AGENT_SSE_PING": "1"})
    session = new_session()
    async with victim.client() as cv, survivor.client() as cs:
        run_id = ""
        asked: Event | None = None
        with contextlib.suppress(httpx.HTTPError):
            async with open_stream(
                cv, "POST", f"/v1/sessions/{session}/runs", json={"input": "delete x.md"}
            ) as (response, stream):
                assert response.status_code == 200
                async for event in stream:
                    run_id = event.data["run_id"]
                    if is_request(event):
                        asked = event
                        break
        assert asked is not None
        kill(victim)

        async def asked_again() -> bool:
            return any(e.type == "run.resumed" for e in await events_so_far(cs, run_id))

        await wait_for(asked_again, within=30)
        await asyncio.sleep(12)  # past the window a streamed run would be cancelled in
        assert (await cs.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting"
        answer = await approve(cs, asked)
        assert answer.status_code == 202, answer.text
        events = await follow(cs, run_id)
        assert events[-1].type == "run.completed"
