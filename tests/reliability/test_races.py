"""Races over real HTTP: one session, many starts; a cancel against a completion; an answer
against a cancel. Each race is run many times with the timing spread so that both sides win
sometimes; every trial must end in exactly one terminal event that the run's status, the
cancel's answer, the answer's status and the stored conversation all agree with.
"""

from __future__ import annotations

import asyncio
import collections
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.probes import wait_idle
from tests.support.problems import assert_problem
from tests.support.server import Server, launch, stop
from tests.support.sse import Event, assert_well_formed, open_stream, read_events
from tests.support.waiting import wait_for, wait_until

# a run of some twenty events: long enough for a cancel to land inside it
RACED = "a run that ends soon " + " ".join(f"w{index}" for index in range(12))
STATUS_OF = {"run.completed": "completed", "run.failed": "failed", "run.cancelled": "cancelled"}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    failed = request.session.testsfailed
    running = launch(
        tmp_path_factory.mktemp("races"),
        {
            "AGENT_MAX_CONCURRENT_RUNS": "256",
            "AGENT_MAX_QUEUED_RUNS": "256",
            "AGENT_CONFIRMATION_TIMEOUT": "30",
        },
    )
    yield running
    stop(running, request, failed)


def session() -> str:
    return f"race-{uuid.uuid4().hex[:12]}"


async def events_of(client: httpx.AsyncClient, run_id: str) -> list[Event]:
    async with asyncio.timeout(20):
        events, response = await read_events(client, "GET", f"/v1/runs/{run_id}/events")
    assert response.status_code == 200
    assert_well_formed(events, run_id)
    return events


async def agrees(client: httpx.AsyncClient, session_id: str, run_id: str, terminal: Event) -> None:
    """The run's status and the stored conversation agree with its terminal event."""
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == STATUS_OF[terminal.type], (run, terminal)
    messages = (await client.get(f"/v1/sessions/{session_id}/messages")).json()["messages"]
    stored = [m for m in messages if m["run_id"] == run_id]
    if terminal.type == "run.completed":
        assert stored and stored[-1]["role"] == "assistant"
        assert run["output"] == terminal.data["data"]["output"]
    elif terminal.type == "run.cancelled":
        # a stopped turn stays, every message of it marked with the cancellation's reason
        reason = terminal.data["data"]["reason"]
        assert all(m.get("stopped") == reason for m in stored), stored
    else:
        assert stored == []  # a failed run leaves the conversation untouched


async def start(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    gate: asyncio.Event,
    release: asyncio.Event,
    at_gate: list[None],
) -> tuple[int, str, dict[str, Any] | None]:
    """Start a run once ``gate`` opens (counted in ``at_gate`` while it waits there); a
    streamed run's answer is held open until ``release``. The status, the run id and the
    problem of a refusal."""
    at_gate.append(None)
    await gate.wait()
    async with client.stream("POST", url, json=body) as response:
        if response.status_code == 200:
            await release.wait()  # keep the stream, so its run, open
            return 200, response.headers["x-run-id"], None
        await response.aread()
        return response.status_code, response.headers.get("x-run-id", ""), response.json()


@pytest.mark.parametrize("mode", ["background", "stream"])
async def test_fifty_starts_on_one_session_admit_exactly_one(server: Server, mode: str) -> None:
    async with server.client() as client:
        for _ in range(4):
            session_id = session()
            url = f"/v1/sessions/{session_id}/runs"
            # the admitted run waits for a confirmation: it holds the session while others try
            body = {"input": "delete report.txt", "background": mode == "background"}
            gate = asyncio.Event()
            release = asyncio.Event()
            at_gate: list[None] = []
            tasks = [
                asyncio.ensure_future(start(client, url, body, gate, release, at_gate))
                for _ in range(50)
            ]

            def all_at_gate(parked: list[None] = at_gate) -> bool:
                return len(parked) == 50

            await wait_until(all_at_gate)  # every start waits at the gate
            gate.set()
            pending = set(tasks)
            async with asyncio.timeout(20):
                while len(pending) > (1 if mode == "stream" else 0):
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            release.set()
            results = await asyncio.gather(*tasks)
            admitted = [r for r in results if r[0] in (200, 202)]
            assert len(admitted) == 1, collections.Counter(r[0] for r in results)
            run_id = admitted[0][1]
            busy = [r for r in results if r[0] == 409]
            assert len(busy) == 49
            for _, _, problem in busy:
                assert problem is not None
                assert problem["code"] == "session_busy"
                assert problem["active_run_id"] == run_id
            if mode == "stream":
                # the streamed run's client went away: its run was cancelled once the
                # disconnect grace passed (reading its events before would re-attach to it)
                async def cancelled(run_id: str = run_id) -> bool:
                    view = (await client.get(f"/v1/runs/{run_id}")).json()
                    return bool(view["status"] == "cancelled")

                await wait_for(cancelled)
                events = await events_of(client, run_id)
                assert events[-1].data["data"] == {"reason": "client_disconnected"}
            else:
                cancel = await client.post(f"/v1/runs/{run_id}/cancel")
                assert cancel.status_code == 202
                events = await events_of(client, run_id)
                assert events[-1].data["data"] == {"reason": "cancel_requested"}
            session_view = (await client.get(f"/v1/sessions/{session_id}")).json()
            assert session_view["active_run_id"] is None
            # only the admitted run left anything: its stopped turn
            messages = (await client.get(f"/v1/sessions/{session_id}/messages")).json()
            assert {m["run_id"] for m in messages["messages"]} <= {run_id}
            assert all(m.get("stopped") for m in messages["messages"])
        await wait_idle(client)


async def cancel_against_completion(
    client: httpx.AsyncClient, delay: float, streamed: bool
) -> tuple[str, int]:
    """One trial; the terminal event's type and the cancel's status."""
    session_id = session()
    if streamed:
        # the client reads the stream while another request cancels the run
        async with open_stream(
            client, "POST", f"/v1/sessions/{session_id}/runs", json={"input": RACED}
        ) as (response, stream):
            run_id = response.headers["x-run-id"]
            await asyncio.sleep(delay)
            cancel = await client.post(f"/v1/runs/{run_id}/cancel")
            seen = [event async for event in stream]
        assert_well_formed(seen, run_id)
    else:
        started = await client.post(
            f"/v1/sessions/{session_id}/runs", json={"input": RACED, "background": True}
        )
        run_id = started.json()["run_id"]
        await asyncio.sleep(delay)
        cancel = await client.post(f"/v1/runs/{run_id}/cancel")
    events = await events_of(client, run_id)
    if streamed:
        assert [e.id for e in events] == [e.id for e in seen]
    terminal = events[-1]
    assert terminal.type in ("run.completed", "run.cancelled"), terminal
    body = cancel.json()
    assert body["run_id"] == run_id
    if cancel.status_code == 200:  # already finished: it says how
        assert body["status"] == STATUS_OF[terminal.type]
    else:
        assert cancel.status_code == 202 and body["status"] == "cancelling"
        # 202 promises the cancel: a run whose outcome was decided first is answered 200
        assert terminal.type == "run.cancelled", (cancel.status_code, terminal)
    if terminal.type == "run.cancelled":
        assert terminal.data["data"] == {"reason": "cancel_requested"}
        assert cancel.status_code == 202
    await agrees(client, session_id, run_id, terminal)
    return terminal.type, cancel.status_code


async def run_length(client: httpx.AsyncClient, streamed: bool) -> float:
    """How long a run takes here, now: the median of a few, from its start (streamed: from its
    answer's headers) to its last event."""
    lengths = []
    for _ in range(7):
        started = time.monotonic()
        if streamed:
            url = f"/v1/sessions/{session()}/runs"
            async with open_stream(client, "POST", url, json={"input": RACED}) as (_, stream):
                started = time.monotonic()
                _ = [event async for event in stream]
        else:
            url = f"/v1/sessions/{session()}/runs"
            run_id = (await client.post(url, json={"input": RACED, "background": True})).json()
            await events_of(client, run_id["run_id"])
        lengths.append(time.monotonic() - started)
    return statistics.median(lengths)


@pytest.mark.slow
@pytest.mark.parametrize("streamed", [False, True], ids=["background", "streamed"])
async def test_cancel_racing_completion(server: Server, streamed: bool) -> None:
    rng = random.Random(7)
    trials = 150
    outcomes: collections.Counter[tuple[str, int]] = collections.Counter()
    async with server.client() as client:
        # the cancel comes anywhere from at once to well after the run would have ended, so
        # that each side wins some trials whatever the speed of the machine
        length = await run_length(client, streamed)
        semaphore = asyncio.Semaphore(8)

        async def trial(delay: float) -> None:
            async with semaphore:
                outcomes[await cancel_against_completion(client, delay, streamed)] += 1

        await asyncio.gather(*(trial(rng.uniform(0, 1.6 * length)) for _ in range(trials)))
        await wait_idle(client)
    print(
        f"cancel against completion ({'streamed' if streamed else 'background'}): {dict(outcomes)}"
    )
    assert sum(outcomes.values()) == trials
    winners = {kind for kind, _ in outcomes}
    assert winners == {"run.completed", "run.cancelled"}, outcomes  # both sides won sometimes


async def answer_against_cancel(client: httpx.AsyncClient, delay: float) -> tuple[int, str]:
    """One trial: a run waits for its confirmation; the answer and a cancel race."""
    session_id = session()
    started = await client.post(
        f"/v1/sessions/{session_id}/runs", json={"input": "delete notes.txt", "background": True}
    )
    run_id = started.json()["run_id"]
    call_id = ""
    async with open_stream(client, "GET", f"/v1/runs/{run_id}/events") as (_, stream):
        async for event in stream:
            if event.type == "custom" and event.data["data"]["name"] == "confirmation_requested":
                call_id = event.data["data"]["payload"]["tool_call_id"]
                break
    assert call_id
    answer = {
        "session_id": session_id,
        "run_id": run_id,
        "name": "confirmation_response",
        "payload": {"tool_call_id": call_id, "approved": True},
    }

    async def cancel_later() -> httpx.Response:
        await asyncio.sleep(delay)
        return await client.post(f"/v1/runs/{run_id}/cancel")

    delivered, cancelled = await asyncio.gather(
        client.post("/external-events", json=answer), cancel_later()
    )
    assert cancelled.status_code in (200, 202)
    events = await events_of(client, run_id)
    terminal = events[-1]
    resolved = [
        e.data["data"]["payload"]["outcome"]
        for e in events
        if e.type == "custom" and e.data["data"]["name"] == "confirmation_resolved"
    ]
    ran = [e for e in events if e.type == "tool.call.completed" and not e.data["data"]["is_error"]]
    if delivered.status_code == 202:
        assert delivered.json() == {"accepted_by": ["ConfirmationExtension"]}
        if terminal.type == "run.completed":
            assert resolved == ["approved"], events
            assert "Deleted notes.txt" in terminal.data["data"]["output"]["content"]
            assert len(ran) == 1
        else:
            # taken, then overtaken by the cancel: before or after the call was released
            assert terminal.type == "run.cancelled", terminal
            assert resolved in ([], ["approved"]) and len(ran) <= len(resolved)
    else:
        # refused: the run was cancelled first, and the call never ran
        problem = assert_problem(delivered, 409, "not_accepted")
        assert problem["accepted_by"] == []
        assert terminal.type == "run.cancelled", terminal
        assert ran == [] and "approved" not in resolved
    if terminal.type == "run.cancelled":
        assert cancelled.status_code == 202
    await agrees(client, session_id, run_id, terminal)
    return delivered.status_code, terminal.type


@pytest.mark.slow
async def test_an_answer_racing_cancellation(server: Server) -> None:
    rng = random.Random(11)
    trials = 120
    outcomes: collections.Counter[tuple[int, str]] = collections.Counter()
    async with server.client() as client:
        semaphore = asyncio.Semaphore(12)

        async def trial(delay: float) -> None:
            async with semaphore:
                outcomes[await answer_against_cancel(client, delay)] += 1

        await asyncio.gather(*(trial(rng.uniform(0, 0.01)) for _ in range(trials)))
        await wait_idle(client)
    print(f"answer against cancel: {dict(outcomes)}")
    assert sum(outcomes.values()) == trials
    assert {status for status, _ in outcomes} == {202, 409}, outcomes
