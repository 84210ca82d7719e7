"""The LangGraph API on two workers sharing Redis and PostgreSQL, through ``langgraph-sdk``:
a stream started on worker A is joined from worker B (from its start, and from a
``Last-Event-ID``), and an interrupt asked on A is answered through B.
"""

from __future__ import annotations

from typing import Any

from langgraph_sdk import get_client

from tests.support.cluster import StartCluster


def _human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def test_stream_on_one_worker_joined_and_answered_on_another(
    start_cluster: StartCluster,
) -> None:
    a, b = start_cluster(2, {"AGENT_DEMO_SLOW_SECONDS": "0.2"})
    on_a = get_client(url=f"{a.base_url}/langgraph")
    on_b = get_client(url=f"{b.base_url}/langgraph")
    try:
        thread: Any = await on_a.threads.create(metadata={"where": "a"})
        tid = thread["thread_id"]
        run: Any = await on_a.runs.create(tid, "default", input=_human("a slow walk home"))
        joined = [p async for p in on_b.runs.join_stream(tid, run["run_id"])]
        assert joined[-1].event == "values"
        assert joined[-1].data["messages"][-1]["content"] == "You said: a slow walk home"
        # from the middle: a reader that saw up to some event id reads on from there on B
        ids = [int(p.id) for p in joined if p.id]
        middle = ids[0]  # the run's first values (its start); its answer comes after
        rest = [
            p async for p in on_b.runs.join_stream(tid, run["run_id"], last_event_id=str(middle))
        ]
        assert rest and all(int(p.id) > middle for p in rest if p.id)
        assert rest[-1].data["messages"][-1]["content"] == "You said: a slow walk home"

        found: Any = await on_b.threads.search(metadata={"where": "a"})
        assert [t["thread_id"] for t in found] == [tid]

        # an interrupt asked by a run on A, answered through B
        asked = [
            p
            async for p in on_a.runs.stream(
                tid, "default", input=_human("delete a.txt"), stream_mode="updates"
            )
        ]
        assert any("__interrupt__" in p.data for p in asked if p.event == "updates")
        state: Any = await on_b.threads.get_state(tid)
        assert state["next"] == ["agent"]
        result: Any = await on_b.runs.wait(
            tid, "default", command={"resume": [{"type": "accept", "args": None}]}
        )
        assert "Deleted a.txt" in result["messages"][-1]["content"]
        history: Any = await on_a.threads.get_history(tid)
        assert len(history) == 2
    finally:
        await on_a.aclose()
        await on_b.aclose()
