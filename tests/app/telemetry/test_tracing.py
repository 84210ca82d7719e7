"""Tracing in the service: when the OTEL_* variables turn it on, the incoming traceparent, the
content setting, and an answer's span (in-process, spans in memory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_runtime.errors import ConfigurationError
from app.settings import Settings
from app.telemetry.tracing import (
    TraceContextMiddleware,
    Tracing,
    check_tracing_environment,
    tracing_requested,
)
from tests.support.served import Serve

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, False),
    ],
)
def test_the_standard_variables_decide(environ: dict[str, str], wanted: bool) -> None:
    assert tracing_requested(environ) is wanted
    built = Tracing.from_environment(capture_content=False, environ=environ)
    assert (built is not None) is wanted
    if built is not None:
        built.provider.shutdown()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin is not supported"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "http/protobuf",
        ),
    ],
)
def test_values_it_cannot_honour_are_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_tracing_environment(environ)


def test_content_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TRACE_CONTENT", "1")
    assert Settings().trace_content is True
    monkeypatch.delenv("AGENT_TRACE_CONTENT")
    assert Settings().trace_content is False
    environ = {"OTEL_TRACES_EXPORTER": "console"}
    built = Tracing.from_environment(capture_content=True, environ=environ)
    assert built is not None and built.tracer.capture_content is True
    built.provider.shutdown()


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing turned on for the apps of the test, its spans kept in memory."""
    memory = InMemorySpanExporter()

    def in_memory(*, capture_content: bool, environ: Any = None) -> Tracing:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        return Tracing(provider, capture_content=capture_content)

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # what installs the middleware
    monkeypatch.setattr(Tracing, "from_environment", staticmethod(in_memory))
    yield memory
    memory.clear()


def spans_of(exporter: InMemorySpanExporter, trace_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


async def test_a_run_joins_the_trace_of_its_request(
    serve: Serve, exporter: InMemorySpanExporter
) -> None:
    async with serve() as served:
        assert any(
            getattr(m, "cls", None) is TraceContextMiddleware for m in served.app.user_middleware
        )
        answer = await served.client.post(
            "/v1/sessions/traced/runs",
            json={"input": "hello there"},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        assert answer.status_code == 200
        run_id = answer.headers["x-run-id"]
        await served.wait_idle()
    spans = spans_of(exporter, TRACE_ID)
    [run] = [s for s in spans if s.name == "invoke_agent default"]
    assert run.parent is not None and f"{run.parent.span_id:016x}" == PARENT_ID
    assert (run.attributes or {})["agent_runtime.run.id"] == run_id
    assert (run.attributes or {})["gen_ai.conversation.id"] == "traced"
    [chat] = [s for s in spans if s.name.startswith("chat ")]
    assert chat.parent is not None and chat.parent.span_id == run.context.span_id
    assert (chat.attributes or {})["gen_ai.provider.name"] == "demo"
    assert "hello there" not in str([dict(s.attributes or {}) for s in spans])


async def test_without_traceparent_a_run_starts_its_own_trace(
    serve: Serve, exporter: InMemorySpanExporter
) -> None:
    async with serve() as served:
        answer = await served.client.post("/v1/sessions/untraced/runs", json={"input": "hi"})
        assert answer.status_code == 200
        await served.wait_idle()
    runs = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "invoke_agent default"
        and (s.attributes or {}).get("gen_ai.conversation.id") == "untraced"
    ]
    assert len(runs) == 1 and runs[0].parent is None


async def test_content_is_recorded_with_agent_trace_content(
    serve: Serve, exporter: InMemorySpanExporter
) -> None:
    async with serve(trace_content=True) as served:
        answer = await served.client.post(
            "/v1/sessions/content/runs",
            json={"input": "hello there"},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        assert answer.status_code == 200
        await served.wait_idle()
    [run] = [s for s in spans_of(exporter, TRACE_ID) if s.name == "invoke_agent default"]
    assert "hello there" in str((run.attributes or {})["gen_ai.input.messages"])


async def test_an_unanswerable_event_is_a_span_in_the_callers_trace(
    serve: Serve, exporter: InMemorySpanExporter
) -> None:
    async with serve() as served:
        created = await served.client.post("/v1/sessions/idle/runs", json={"input": "hi"})
        assert created.status_code == 200
        await served.wait_idle()
        answer = await served.client.post(
            "/external-events",
            json={"session_id": "idle", "name": "confirmation_response", "payload": {}},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        assert answer.status_code == 409
    [span] = [s for s in spans_of(exporter, TRACE_ID) if s.name.startswith("external_event")]
    assert span.name == "external_event confirmation_response"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
    assert (span.attributes or {})["agent_runtime.external_event.accepted"] is False
    assert span.links == ()  # no run in progress to link to
