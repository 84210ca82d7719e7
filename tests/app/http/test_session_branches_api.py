"""Branches over HTTP: a run started with ``branch_from`` continues an earlier turn (or the
start), the model sees that branch only, GET /v1/sessions/{id}/messages names each turn's
parent, and a ``branch_from`` that is no stored turn of the caller's session is refused before
anything starts.

The demo model counts every word it is given as an input token, so a run's
``usage.input_tokens`` says which conversation it saw.
"""

from __future__ import annotations

from typing import Any

from tests.support.served import Serve, Served, assert_problem, run_blocking
from tests.support.waiting import wait_until


def _words(*texts: str) -> int:
    return sum(len(text.split()) for text in texts)


async def _run(served: Served, session: str, text: str, **extra: Any) -> dict[str, Any]:
    answer = await run_blocking(served, session, text, **extra)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["status"] == "completed", body
    return body


async def _turns(served: Served, session: str) -> list[tuple[str, str | None, str]]:
    """(run id, parent run, prompt) of each turn listed, in stored order."""
    body = (await served.client.get(f"/v1/sessions/{session}/messages")).json()
    firsts = [m for m in body["messages"] if "parent_run" in m]
    assert len(firsts) == len({m["run_id"] for m in body["messages"]})
    assert all(m["role"] == "user" for m in firsts)
    return [(m["run_id"], m["parent_run"], m["content"]) for m in firsts]


async def test_a_run_branches_from_an_earlier_turn(serve: Serve) -> None:
    async with serve() as served:
        one = await _run(served, "b", "one")
        two = await _run(served, "b", "two")
        three = await _run(served, "b", "three")
        # three words, "You said: three", sit on the other branch: the model never sees them
        fork = await _run(served, "b", "two, said better", branch_from=one["run_id"])
        assert fork["usage"]["input_tokens"] == _words("one", "You said: one", "two, said better")
        assert await _turns(served, "b") == [
            (one["run_id"], None, "one"),
            (two["run_id"], one["run_id"], "two"),
            (three["run_id"], two["run_id"], "three"),
            (fork["run_id"], one["run_id"], "two, said better"),
        ]

        # without branch_from the session goes on from its latest turn: the fork
        then = await _run(served, "b", "and then")
        assert then["usage"]["input_tokens"] == _words(
            "one", "You said: one", "two, said better", "You said: two, said better", "and then"
        )
        # and an old branch can be continued by naming its last turn
        more = await _run(served, "b", "four", branch_from=three["run_id"])
        assert more["usage"]["input_tokens"] == _words(
            "one", "You said: one", "two", "You said: two", "three", "You said: three", "four"
        )
        turns = await _turns(served, "b")
        assert [(run, parent) for run, parent, _ in turns[-2:]] == [
            (then["run_id"], fork["run_id"]),
            (more["run_id"], three["run_id"]),
        ]
        # every branch stays stored: nothing was removed
        session = (await served.client.get("/v1/sessions/b")).json()
        assert session["message_count"] == 12


async def test_a_new_first_turn_from_the_start(serve: Serve) -> None:
    async with serve() as served:
        one = await _run(served, "s", "one")
        await _run(served, "s", "two")
        again = await _run(served, "s", "one, edited", branch_from="start")
        assert again["usage"]["input_tokens"] == _words("one, edited")
        after = await _run(served, "s", "next")
        assert after["usage"]["input_tokens"] == _words(
            "one, edited", "You said: one, edited", "next"
        )
        parents = [(parent, prompt) for _, parent, prompt in await _turns(served, "s")]
        assert parents == [
            (None, "one"),
            (one["run_id"], "two"),
            (None, "one, edited"),
            (again["run_id"], "next"),
        ]
        # the session keeps the title of its first input
        assert (await served.client.get("/v1/sessions/s")).json()["title"] == "one"


async def test_branch_from_names_a_stored_turn_of_the_session(serve: Serve) -> None:
    async with serve() as served:
        one = await _run(served, "r", "one")
        other = await _run(served, "elsewhere", "hello")
        failed = await run_blocking(served, "r", "what time is it", max_iterations=1)
        assert failed.json()["status"] == "failed"  # a failed run stores no turn

        unknown = await run_blocking(served, "r", "x", branch_from="run_nope")
        assert_problem(unknown, 404, "not_found")
        elsewhere = await run_blocking(served, "r", "x", branch_from=other["run_id"])
        assert_problem(elsewhere, 404, "not_found")
        no_turn = await run_blocking(served, "r", "x", branch_from=failed.json()["run_id"])
        assert_problem(no_turn, 422, "not_a_turn")
        both = await run_blocking(
            served, "r", "x", branch_from=one["run_id"], replaces=one["run_id"]
        )
        assert_problem(both, 422, "validation_error")
        # null too: leave it out instead (so both members present is refused, as the schema
        # says, whatever their values)
        both_null = await run_blocking(served, "r", "x", branch_from=None, replaces=None)
        assert_problem(both_null, 422, "validation_error")
        for bad in ("", "x" * 129, 7, None):
            assert_problem(
                await run_blocking(served, "r", "x", branch_from=bad), 422, "validation_error"
            )
        # a refused start creates no session either
        fresh = await run_blocking(served, "fresh", "x", branch_from=one["run_id"])
        assert_problem(fresh, 404, "not_found")
        assert_problem(await served.client.get("/v1/sessions/fresh"), 404, "not_found")

        # nothing was started by the refusals
        runs = (await served.client.get("/v1/sessions/r/messages")).json()["runs"]
        assert [r["run_id"] for r in runs] == [one["run_id"]]


async def test_another_principals_run_is_not_found(serve: Serve) -> None:
    async with serve(api_keys="key-a=alice,key-b=bob") as served:
        alice = {"Authorization": "Bearer key-a"}
        bob = {"Authorization": "Bearer key-b"}
        mine = await run_blocking(served, "alice-s", "hello", headers=alice)
        assert mine.status_code == 200, mine.text
        run_id = mine.json()["run_id"]
        # bob names alice's run: from his own session, and from hers
        await _run_as(served, "bob-s", "hi", bob)
        refused = await run_blocking(served, "bob-s", "x", headers=bob, branch_from=run_id)
        assert_problem(refused, 404, "not_found")
        theirs = await run_blocking(served, "alice-s", "x", headers=bob, branch_from=run_id)
        assert_problem(theirs, 404, "not_found")
        # alice may
        ok = await run_blocking(served, "alice-s", "again", headers=alice, branch_from="start")
        assert ok.status_code == 200, ok.text


async def _run_as(served: Served, session: str, text: str, headers: dict[str, str]) -> None:
    answer = await run_blocking(served, session, text, headers=headers)
    assert answer.status_code == 200, answer.text


async def test_a_waiting_first_turn_from_the_start_shows_alone_in_langgraph_state(
    serve: Serve,
) -> None:
    # a run from the start that waits for an answer: the thread's state is that run's branch
    # (its prompt alone), not the latest stored turn's
    async with serve() as served:
        await _run(served, "w", "one")
        started = await served.client.post(
            "/v1/sessions/w/runs",
            json={"input": "delete a.txt", "branch_from": "start", "background": True},
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]

        async def waiting() -> bool:
            view = (await served.client.get(f"/v1/runs/{run_id}")).json()
            return bool(view["status"] == "waiting")

        await wait_until(waiting)
        state = (await served.client.get("/langgraph/threads/w/state")).json()
        messages = state["values"]["messages"]
        assert [(m["type"], m["content"]) for m in messages][:1] == [("human", "delete a.txt")]
        assert "one" not in [m["content"] for m in messages]
        assert state["tasks"][0]["interrupts"][0]["value"]["action_request"]["action"] == (
            "delete_file"
        )
