"""Load shedding on the protocols' paths: a run start is refused before its body is parsed;
an answer to a waiting run (AG-UI ``resume``, an AI SDK approval) is let through."""

from __future__ import annotations

import httpx

from tests.support.served import Serve

JSON = {"Content-Type": "application/json"}


def _problem(answer: httpx.Response, status: int, code: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == code


async def test_protocol_run_starts_are_shed_but_answers_go_through(serve: Serve) -> None:
    async with serve(max_concurrent_runs=1, max_queued_runs=0, demo_slow_seconds=0.1) as served:
        client = served.client
        agui = "/v1/agents/default/ag-ui"
        chat = "/v1/agents/default/ai-sdk/chat"
        # not full: a broken body is parsed and refused for what it is
        _problem(
            await client.post(agui, content=b"{not json", headers=JSON), 422, "validation_error"
        )
        held = await client.post(
            "/v1/sessions/held/runs", json={"input": "slow a b c", "background": True}
        )
        assert held.status_code == 202
        # full: a start is refused at once, body unread
        _problem(await client.post(agui, content=b"{not json", headers=JSON), 429, "overloaded")
        _problem(await client.post(chat, content=b"{not json", headers=JSON), 429, "overloaded")
        # an answer is read and goes on to the route (here refused there, for its broken body)
        answer = b'{"resume": [ broken'
        _problem(await client.post(agui, content=answer, headers=JSON), 422, "validation_error")
        approval = b'{"state": "approval-responded" broken'
        _problem(await client.post(chat, content=approval, headers=JSON), 422, "validation_error")
        # other paths under /v1/agents are not the middleware's
        stream = await client.get("/v1/agents/default/ai-sdk/chat/held/stream")
        assert stream.status_code in (200, 204)
        metrics = (await client.get("/metrics")).text
        assert 'agent_runs_rejected_total{reason="overloaded"} 2.0' in metrics
