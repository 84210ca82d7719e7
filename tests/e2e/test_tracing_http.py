"""Traces over real HTTP: a server process exports OTLP/HTTP to a receiver process on loopback.

The receiver (``tests.fakes.otlp_receiver``) decodes the protobuf with ``opentelemetry-proto``;
the tests read what it received and check the span tree, the caller's trace id honoured from
``traceparent``, and an answer given on another worker joining the run's trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Launch, Server, launch
from tests.support.services import shared_backend
from tests.support.sse import Event, open_stream
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@dataclass
class Receiver:
    endpoint: str
    out: Path

    def spans(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans() if s["trace_id"] == trace_id]


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    out = tmp_path / "spans.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.otlp_receiver", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield Receiver(f"http://127.0.0.1:{port}", out)
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def tracing_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "agent-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **extra,
    }


def named(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name]
    assert len(found) == 1, [s["name"] for s in spans]
    return found[0]


async def confirm_on(start_on: Server, answer_on: Server, session: str) -> tuple[str, list[Event]]:
    """Start "delete plans.md" on one server (with our traceparent), approve it on another."""
    events: list[Event] = []
    async with (
        start_on.client(headers={"traceparent": TRACEPARENT}) as client,
        answer_on.client() as other,
        open_stream(
            client, "POST", f"/v1/sessions/{session}/runs", json={"input": "delete plans.md"}
        ) as (response, stream),
    ):
        run_id = response.headers["x-run-id"]
        async for event in stream:
            events.append(event)
            data = event.data["data"]
            if event.type == "custom" and data["name"] == "confirmation_requested":
                payload = data["payload"]
                answer = {
                    "session_id": session,
                    "name": payload["response_event"],
                    "payload": {"tool_call_id": payload["tool_call_id"], "approved": True},
                }
                accepted = await other.post("/external-events", json=answer)
                assert accepted.status_code == 202, accepted.text
    assert events[-1].type == "run.completed"
    return run_id, events


def check_run_tree(spans: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    run = named(spans, "invoke_agent default")
    assert run["parent_span_id"] == PARENT_ID  # the caller's span
    assert run["service"] == "agent-e2e"
    assert run["attributes"]["agent_runtime.run.id"] == run_id
    assert run["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    chats = [s for s in spans if s["name"].startswith("chat ")]
    assert len(chats) == 2
    for chat in chats:
        assert chat["parent_span_id"] == run["span_id"]
        assert chat["attributes"]["gen_ai.operation.name"] == "chat"
        assert chat["attributes"]["gen_ai.usage.output_tokens"] > 0
    tool = named(spans, "execute_tool delete_file")
    assert tool["parent_span_id"] == run["span_id"]
    assert tool["attributes"]["gen_ai.tool.name"] == "delete_file"
    assert [e["name"] for e in run["events"]] == ["confirmation_requested", "confirmation_resolved"]
    assert (
        run["events"][0]["attributes"]["gen_ai.tool.call.id"]
        == (tool["attributes"]["gen_ai.tool.call.id"])
    )
    # no prompt, argument or result: AGENT_TRACE_CONTENT is off
    assert "plans.md" not in json.dumps(spans)
    return run


async def test_a_run_is_exported_in_the_callers_trace(
    start_server: Launch, receiver: Receiver
) -> None:
    server = start_server(tracing_env(receiver))
    run_id, _ = await confirm_on(server, server, f"trace-{uuid.uuid4().hex[:10]}")

    async def complete() -> list[dict[str, Any]] | None:
        spans = receiver.trace(TRACE_ID)
        names = {s["name"] for s in spans}
        wanted = {
            "invoke_agent default",
            "execute_tool delete_file",
            "external_event confirmation_response",
        }
        return spans if wanted <= names else None

    spans = await wait_for(complete)
    run = check_run_tree(spans, run_id)
    # the answer had no traceparent of its own: it continues the run's trace, linked to it
    answer = named(spans, "external_event confirmation_response")
    assert answer["parent_span_id"] == run["span_id"]
    assert answer["links"] == [{"trace_id": TRACE_ID, "span_id": run["span_id"]}]
    assert answer["attributes"]["agent_runtime.external_event.accepted"] is True


THINKER = """
[agents.thinker]
model = "python:tests.fakes.reasoning_models:thinker"
tools = ["current_time"]
"""


async def test_spans_carry_the_cache_and_reasoning_counts(
    start_server: Launch, receiver: Receiver, tmp_path: Path
) -> None:
    config = tmp_path / "agents.toml"
    config.write_text(THINKER, encoding="utf-8")
    server = start_server(tracing_env(receiver, AGENT_CONFIG=str(config)))
    async with server.client(headers={"traceparent": TRACEPARENT}) as client:
        done = await client.post(
            "/v1/sessions/trace-thinker/runs",
            json={"input": "what time is it?", "agent": "thinker", "stream": False},
        )
        assert done.status_code == 200, done.text
    usage = done.json()["usage"]

    async def complete() -> list[dict[str, Any]] | None:
        spans = receiver.trace(TRACE_ID)
        return spans if "invoke_agent thinker" in {s["name"] for s in spans} else None

    spans = await wait_for(complete)
    chats = [s["attributes"] for s in spans if s["name"].startswith("chat ")]
    assert len(chats) == 2
    for chat in chats:  # each call's own counts (tests/fakes/reasoning_models.py)
        assert chat["gen_ai.usage.cache_read.input_tokens"] == 80
        assert chat["gen_ai.usage.cache_creation.input_tokens"] == 20
        assert chat["gen_ai.usage.reasoning.output_tokens"] == 8
    run = named(spans, "invoke_agent thinker")["attributes"]
    # the run's span sums them, as the run's usage does
    assert run["gen_ai.usage.cache_read.input_tokens"] == usage["cached_input_tokens"] == 160
    assert run["gen_ai.usage.cache_creation.input_tokens"] == usage["cache_write_tokens"] == 40
    assert run["gen_ai.usage.reasoning.output_tokens"] == usage["reasoning_tokens"] == 16


@pytest.mark.slow
async def test_nothing_is_exported_without_the_variables(
    start_server: Launch, receiver: Receiver
) -> None:
    server = start_server({"OTEL_BSP_SCHEDULE_DELAY": "50"})
    await confirm_on(server, server, f"trace-{uuid.uuid4().hex[:10]}")
    async with server.client() as client:
        assert (await client.get("/healthz")).status_code == 200
    server.stop()  # a shutdown flushes what an exporter holds: there is none
    assert receiver.spans() == []


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
async def test_an_answer_on_another_worker_joins_the_runs_trace(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> None:
    with shared_backend() as env:
        env = {**env, **tracing_env(receiver)}
        one = launch(tmp_path_factory.mktemp("trace-one"), env)
        two = launch(tmp_path_factory.mktemp("trace-two"), env)
        try:
            run_id, _ = await confirm_on(one, two, f"trace-{uuid.uuid4().hex[:10]}")

            async def answered() -> list[dict[str, Any]] | None:
                spans = receiver.trace(TRACE_ID)
                names = {s["name"] for s in spans}
                done = {"invoke_agent default", "external_event confirmation_response"}
                return spans if done <= names else None

            spans = await wait_for(answered)
        finally:
            one.stop()
            two.stop()
    run = check_run_tree(spans, run_id)
    answer = named(spans, "external_event confirmation_response")
    assert answer["parent_span_id"] == run["span_id"]
    assert answer["links"] == [{"trace_id": TRACE_ID, "span_id": run["span_id"]}]
    # both workers exported into the one trace
    assert answer["attributes"]["agent_runtime.external_event.accepted"] is True
