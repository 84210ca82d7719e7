"""Edited arguments answered through a worker that does not hold the run: the worker the answer
reaches refuses an edit the tool does not allow, or arguments it cannot take, with the same
422 the holder's runtime gives (a refusal there could not come back over the bus), and routes a
valid edit to the holder, where the tool runs with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.cluster import StartCluster, new_session
from tests.support.problems import assert_problem
from tests.support.runs import events_so_far, follow, is_request
from tests.support.waiting import wait_for

CONFIG = """
[agents.editor]
model = "demo"
tools = ["current_time", "delete_file"]
editable_tools = ["delete_file"]

[agents.editor.policies]
delete_file = "ask"
"""


async def _asked(
    holder: httpx.AsyncClient, reader: httpx.AsyncClient, agent: str, text: str
) -> tuple[str, str, dict[str, Any]]:
    """A run of ``agent`` started on ``holder``, and its question as ``reader`` reads it."""
    session = new_session()
    started = await holder.post(
        f"/v1/sessions/{session}/runs", json={"input": text, "agent": agent, "background": True}
    )
    assert started.status_code == 202, started.text
    run_id: str = started.json()["run_id"]

    async def question() -> dict[str, Any] | None:
        found = [e for e in await events_so_far(reader, run_id) if is_request(e)]
        return found[0].data["data"]["payload"] if found else None

    return session, run_id, await wait_for(question)


def _answer(session: str, run_id: str, call_id: str, arguments: Any) -> dict[str, Any]:
    return {
        "session_id": session,
        "run_id": run_id,
        "name": "confirmation_response",
        "payload": {"tool_call_id": call_id, "approved": True, "arguments": arguments},
    }


async def test_an_edit_answered_through_another_worker_is_checked_there(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    config = tmp_path / "agents.toml"
    config.write_text(CONFIG, encoding="utf-8")
    holder, other = start_cluster(2, {"AGENT_CONFIG": str(config)})
    async with holder.client() as on_holder, other.client() as on_other:
        session, run_id, asked = await _asked(on_holder, on_other, "editor", "delete draft.md")
        call_id = asked["tool_call_id"]
        wrong = _answer(session, run_id, call_id, {"path": ["not", "a", "path"]})
        assert_problem(
            await on_other.post("/external-events", json=wrong), 422, "invalid_arguments"
        )
        edited = _answer(session, run_id, call_id, {"path": "final.md"})
        accepted = await on_other.post("/external-events", json=edited)
        assert accepted.status_code == 202, accepted.text
        events = await follow(on_holder, run_id)
        completed = next(e for e in events if e.type == "tool.call.completed").data["data"]
        assert completed["result"] == "Deleted final.md" and completed["edited"] is True

        session, run_id, asked = await _asked(on_holder, on_other, "default", "delete plans.md")
        refused = _answer(session, run_id, asked["tool_call_id"], {"path": "other.md"})
        assert_problem(
            await on_other.post("/external-events", json=refused), 422, "edit_not_allowed"
        )
        status = (await on_other.get(f"/v1/runs/{run_id}")).json()["status"]
        assert status == "waiting"
