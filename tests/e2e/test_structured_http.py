"""A client's response_format over HTTP, through a real ``agent-server`` process: schemas that
cannot be validated safely are a 422 naming where, and a catastrophic pattern neither stalls the
worker nor fails the run with anything but ``invalid_output``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.upstream import FakeUpstream, Text
from tests.support.server import Server, launch
from tests.support.sse import read_events


def _format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream.in_thread(default=Text("OK")) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream) -> Iterator[Server]:
    directory = tmp_path_factory.mktemp("structured")
    config = directory / "agents.toml"
    config.write_text('[agents.writer]\nmodel = "openai:gpt-test"\n', encoding="utf-8")
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


def _deep(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    for _ in range(depth - 1):
        schema = {"items": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "kind", "loc"),
    [
        (
            {"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"},
            "schema_ref_cycle",
            ["$defs", "n"],
        ),
        ({"properties": {"a": {"$ref": "#"}}, "anyOf": [{"$ref": "#"}]}, "schema_ref_cycle", []),
        (_deep(400), "schema_too_deep", None),
        ({"type": "string", "pattern": "(a)\\1"}, "schema_pattern", ["pattern"]),
    ],
)
async def test_a_schema_that_cannot_be_validated_safely_is_a_422(
    server: Server, schema: dict[str, Any], kind: str, loc: list[Any] | None
) -> None:
    body = {"input": "x", "agent": "writer", "response_format": _format(schema)}
    async with server.client() as client:
        answer = await client.post("/v1/sessions/structured-bad/runs", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == "validation_error"
    assert "response_format.json_schema.schema" in problem["detail"]
    [error] = problem["errors"]
    assert error["type"] == kind
    assert error["loc"][:4] == ["body", "response_format", "json_schema", "schema"]
    if loc is not None:
        assert error["loc"][4:] == loc


async def test_a_tree_schema_is_accepted(server: Server, upstream: FakeUpstream) -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    upstream.script(Text('{"children": [{"children": []}]}'))
    body = {"input": "a tree", "agent": "writer", "stream": False, "response_format": _format(tree)}
    async with server.client() as client:
        answer = await client.post("/v1/sessions/structured-tree/runs", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"]["structured"] == {"children": [{"children": []}]}


async def test_a_catastrophic_pattern_neither_stalls_the_worker_nor_fails_it(
    server: Server, upstream: FakeUpstream
) -> None:
    # 28 a's and a "!" took Python's re about 9 s a check, with the worker's loop stalled
    answer = Text('"' + "a" * 28 + '!"')
    upstream.script(answer, answer, answer)
    body = {
        "input": "a's",
        "agent": "writer",
        "background": True,
        "response_format": _format({"type": "string", "pattern": "^(a+)+$"}),
    }
    worst = 0.0
    async with server.client() as client:
        started = await client.post("/v1/sessions/structured-redos/runs", json=body)
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        reading = asyncio.create_task(read_events(client, "GET", f"/v1/runs/{run_id}/events"))
        while not reading.done():
            sent = time.perf_counter()
            health = await client.get("/healthz")
            worst = max(worst, time.perf_counter() - sent)
            assert health.status_code == 200
        events, _ = await reading
    failed = events[-1]
    assert failed.type == "run.failed"
    assert failed.data["data"]["error"]["code"] == "invalid_output"
    assert worst < 2.0, f"/healthz took {worst:.2f} s while the answers were checked"
