"""Skills and structured output over HTTP, through a real ``agent-server`` process.

One server for the module, configured by a TOML file: ``helper`` runs the scripted
``tool_caller`` model with two skill folders (the later overriding the earlier) and the scripted
``router`` as its ``system_one``; ``writer`` is ``openai:gpt-test`` against the fake upstream,
so structured output goes over the real OpenAI wire.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.upstream import FakeUpstream, Text
from tests.support.server import Server, launch
from tests.support.sse import Event, assert_well_formed, read_events

TOOL_CALLER = "python:tests.fakes.config_models:tool_caller"
ROUTER = "python:tests.fakes.config_models:router"

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}


def write_skill(root: Path, name: str, description: str, body: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n---\n{body}\n", encoding="utf-8"
    )


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    # the warm-up run (and any unscripted call) gets a plain answer
    with FakeUpstream.in_thread(default=Text("OK")) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("skills")
    write_skill(directory / "skills" / "base", "forms", "Old description.", "OLD-BODY")
    write_skill(directory / "skills" / "base", "triage", "Sort issues.", "TRIAGE-BODY")
    write_skill(directory / "skills" / "override", "forms", "Fill in forms.", "FORMS-BODY")
    config = directory / "agents.toml"
    config.write_text(
        f"""
[agents.helper]
description = "Helps with paperwork."
model = "{TOOL_CALLER}"
system_one = "{ROUTER}"
skills = ["skills/base", "skills/override"]

[agents.writer]
model = "openai:gpt-test"
""",
        encoding="utf-8",
    )
    running = launch(
        directory / "server",
        {
            "AGENT_CONFIG": str(config),
            "OPENAI_BASE_URL": upstream.openai_url,
            "OPENAI_API_KEY": "sk-upstream-test",
            "AGENT_CLIENT_MAX_RETRIES": "0",
        },
    )
    yield running
    running.stop()
    log = running.log()
    assert "Traceback" not in log, log[-5000:]


async def run(
    client: httpx.AsyncClient, session: str, body: dict[str, Any]
) -> tuple[list[Event], httpx.Response]:
    events, response = await read_events(client, "POST", f"/v1/sessions/{session}/runs", json=body)
    if response.status_code == 200:
        assert_well_formed(events, response.headers["X-Run-Id"])
    return events, response


def activated(events: list[Event]) -> list[Any]:
    return [
        e.data["data"]["payload"]
        for e in events
        if e.type == "custom" and e.data["data"]["name"] == "skill_activated"
    ]


async def test_agents_lists_every_agent_with_its_skills(server: Server) -> None:
    async with server.client() as client:
        answer = await client.get("/v1/agents")
    assert answer.status_code == 200
    agents = {a["name"]: a for a in answer.json()["agents"]}
    assert set(agents) == {"default", "helper", "writer"}
    assert agents["helper"] == {
        "name": "helper",
        "description": "Helps with paperwork.",
        "model": "tool-caller",
        "skills": [
            {"name": "forms", "description": "Fill in forms."},  # the later path wins
            {"name": "triage", "description": "Sort issues."},
        ],
        "ready": True,
    }
    assert agents["writer"]["skills"] == []
    assert agents["writer"]["model"] == "gpt-test"
    assert agents["default"]["description"] is None
    assert all(a["ready"] for a in agents.values())


async def test_a_run_names_a_skill_active_from_its_start(server: Server) -> None:
    async with server.client() as client:
        events, response = await run(
            client, "skill-named", {"input": "system", "agent": "helper", "skill": "triage"}
        )
    assert response.status_code == 200
    assert activated(events) == [{"skill": "triage"}]
    assert events[0].type == "run.started"
    content = events[-1].data["data"]["output"]["content"]
    assert "The skill triage is active" in content
    assert "TRIAGE-BODY" in content
    assert "- forms: Fill in forms." in content


async def test_dispatch_asks_the_system_one_model(server: Server) -> None:
    async with server.client() as client:
        events, _ = await run(
            client, "skill-routed", {"input": "system route:forms", "agent": "helper"}
        )
        assert activated(events) == [{"skill": "forms"}]
        assert "FORMS-BODY" in events[-1].data["data"]["output"]["content"]
        events, _ = await run(client, "skill-unrouted", {"input": "system", "agent": "helper"})
        assert activated(events) == []


async def test_the_model_loads_a_skill_with_its_tool(server: Server) -> None:
    body = {"input": 'call load_skill {"name": "forms"}', "agent": "helper"}
    async with server.client() as client:
        events, _ = await run(client, "skill-tool", body)
    assert activated(events) == [{"skill": "forms"}]
    [done] = [e for e in events if e.type == "tool.call.completed"]
    assert done.data["data"]["name"] == "load_skill"
    assert "FORMS-BODY" in done.data["data"]["result"]
    assert events[-1].type == "run.completed"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"input": "x", "agent": "helper", "skill": "Bad Name" * 10}, "skill"),
        (
            {
                "input": "x",
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 1}}},
            },
            "not a valid JSON schema",
        ),
        ({"input": "x", "response_format": {"type": "text"}}, "response_format"),
    ],
)
async def test_bad_skill_or_format_is_a_422_problem(
    server: Server, body: dict[str, Any], detail: str
) -> None:
    async with server.client() as client:
        answer = await client.post("/v1/sessions/skill-bad/runs", json=body)
    assert answer.status_code == 422
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "validation_error"
    assert detail in json.dumps(problem)


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"input": "x", "agent": "helper", "skill": "absent"}, "no skill 'absent'"),
        ({"input": "x", "agent": "writer", "skill": "forms"}, "has no skills"),
    ],
)
async def test_an_unknown_skill_is_a_404_like_an_unknown_agent(
    server: Server, body: dict[str, Any], detail: str
) -> None:
    async with server.client() as client:
        answer = await client.post("/v1/sessions/skill-unknown/runs", json=body)
    assert answer.status_code == 404
    problem = answer.json()
    assert problem["code"] == "not_found"
    assert detail in problem["detail"]


async def test_response_format_end_to_end_over_the_openai_wire(
    server: Server, upstream: FakeUpstream
) -> None:
    upstream.script(
        Text('{"city": "Oslo", "celsius": "cold"}'), Text('{"city": "Oslo", "celsius": -3}')
    )
    body = {
        "input": "weather?",
        "agent": "writer",
        "stream": False,
        "response_format": RESPONSE_FORMAT,
    }
    async with server.client() as client:
        answer = await client.post("/v1/sessions/structured-1/runs", json=body)
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["status"] == "completed"
        assert result["output"]["structured"] == {"city": "Oslo", "celsius": -3}
        stored = (await client.get(f"/v1/runs/{result['run_id']}")).json()
        assert stored["output"]["structured"] == {"city": "Oslo", "celsius": -3}
        events, _ = await read_events(client, "GET", f"/v1/runs/{result['run_id']}/events")
    assert events[-1].data["data"]["output"]["structured"] == {"city": "Oslo", "celsius": -3}
    first, second = upstream.requests[-2:]
    assert first.json["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": False},
    }
    assert "'cold' is not of type 'integer'" in second.json["messages"][-1]["content"]


async def test_an_answer_that_never_validates_fails_the_run(
    server: Server, upstream: FakeUpstream
) -> None:
    upstream.script(Text("{}"), Text("{}"), Text("nope"))
    body = {"input": "weather?", "agent": "writer", "response_format": RESPONSE_FORMAT}
    async with server.client() as client:
        events, response = await run(client, "structured-2", body)
    assert response.status_code == 200
    failed = events[-1]
    assert failed.type == "run.failed"
    assert failed.data["data"]["error"]["code"] == "invalid_output"
    assert "3 attempt(s)" in failed.data["data"]["error"]["message"]
