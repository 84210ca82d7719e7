"""OTelTracer: the span tree of a run, its attributes, errors, confirmations and content policy."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterator

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from agent_runtime import (
    AgentCore,
    AgentEventType,
    AgentRunConfig,
    ProviderError,
    RunCancelledError,
    RunTimeoutError,
    ToolCall,
    ToolPolicy,
    tool,
)
from agent_runtime.content import ContentPart, ImagePart, TextPart
from agent_runtime.extensions.confirmation import CONFIRMATION_RESPONSE, ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.integrations.otel import OTelTracer
from agent_runtime.messages import AssistantMessage
from agent_runtime.model import ModelResponse, Usage
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.content_samples import big_png

SECRET_PROMPT = "my card is 4111-1111"
SECRET_ARG = "hunter2-argument"


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def broken(key: str) -> str:
    """Always fails."""
    raise RuntimeError(f"cannot read {key}")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


def tracer_for(exporter: InMemorySpanExporter, *, content: bool = False) -> OTelTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OTelTracer(tracer_provider=provider, capture_content=content)


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def all_attribute_text(spans: tuple[ReadableSpan, ...]) -> str:
    parts: list[str] = []
    for span in spans:
        parts.extend(str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            parts.extend(str(v) for v in (event.attributes or {}).values())
        parts.append(span.status.description or "")
    return "\n".join(parts)


def tool_turn_model() -> ScriptedModel:
    answer = ModelResponse(AssistantMessage("the value"), Usage(7, 3, "scripted-2"), "stop")
    return ScriptedModel(
        [tool_call_turn("lookup", {"key": SECRET_ARG}, call_id="c1"), answer],
        model_name="scripted",
    )


async def run_to_end(agent: AgentCore, prompt: str, config: AgentRunConfig) -> None:
    async for _ in agent.stream(prompt, config=config):
        pass


async def test_a_run_is_a_tree_of_agent_model_and_tool_spans(
    exporter: InMemorySpanExporter,
) -> None:
    agent = AgentCore(tool_turn_model(), tools=[lookup], name="helper", tracer=tracer_for(exporter))
    await run_to_end(agent, SECRET_PROMPT, AgentRunConfig(session_id="s1", run_id="run_1"))
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    chats = by_name(spans, "chat ")
    [call] = by_name(spans, "execute_tool ")
    assert run.name == "invoke_agent helper"
    assert run.parent is None and run.kind is SpanKind.INTERNAL
    assert run.status.status_code is StatusCode.OK
    attrs = dict(run.attributes or {})
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "helper"
    assert attrs["gen_ai.conversation.id"] == "s1"
    assert attrs["agent_runtime.run.id"] == "run_1"
    assert len(chats) == 2
    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    for chat in chats:
        assert chat.name == "chat scripted"
        assert chat.kind is SpanKind.CLIENT
        assert chat.parent is not None and chat.parent.span_id == run.context.span_id
        chat_attrs = dict(chat.attributes or {})
        assert chat_attrs["gen_ai.operation.name"] == "chat"
        assert chat_attrs["gen_ai.request.model"] == "scripted"
        assert chat_attrs["gen_ai.provider.name"] == "ScriptedModel"
        assert chat_attrs["gen_ai.system"] == "ScriptedModel"
    second_attrs = dict(second.attributes or {})
    assert second_attrs["gen_ai.response.model"] == "scripted-2"
    assert second_attrs["gen_ai.usage.input_tokens"] == 7
    assert second_attrs["gen_ai.usage.output_tokens"] == 3
    assert second_attrs["gen_ai.response.finish_reasons"] == ("stop",)
    first_usage = dict(first.attributes or {})
    first_in, first_out = (
        first_usage["gen_ai.usage.input_tokens"],
        first_usage["gen_ai.usage.output_tokens"],
    )
    assert isinstance(first_in, int) and isinstance(first_out, int)
    # the run's totals are the sum of its calls
    assert attrs["gen_ai.usage.input_tokens"] == 7 + first_in
    assert attrs["gen_ai.usage.output_tokens"] == 3 + first_out
    assert call.name == "execute_tool lookup"
    assert call.parent is not None and call.parent.span_id == run.context.span_id
    assert (first.end_time or 0) <= (call.start_time or 0) <= (second.start_time or 0)
    call_attrs = dict(call.attributes or {})
    assert call_attrs["gen_ai.operation.name"] == "execute_tool"
    assert call_attrs["gen_ai.tool.name"] == "lookup"
    assert call_attrs["gen_ai.tool.call.id"] == "c1"
    assert call.status.status_code is StatusCode.UNSET
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}
    # no prompt, answer or argument in any span without capture_content
    text = all_attribute_text(spans)
    assert SECRET_PROMPT not in text and SECRET_ARG not in text and "the value" not in text
    assert not any("gen_ai.input.messages" in (s.attributes or {}) for s in spans)


async def test_content_is_recorded_only_when_asked(exporter: InMemorySpanExporter) -> None:
    agent = AgentCore(
        tool_turn_model(),
        tools=[lookup],
        system_prompt="be brief",
        tracer=tracer_for(exporter, content=True),
    )
    await run_to_end(agent, SECRET_PROMPT, AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    [call] = by_name(spans, "execute_tool ")
    first = min(by_name(spans, "chat "), key=lambda s: s.start_time or 0)
    run_input = json.loads(str((run.attributes or {})["gen_ai.input.messages"]))
    assert run_input == [{"role": "user", "parts": [{"type": "text", "content": SECRET_PROMPT}]}]
    run_output = json.loads(str((run.attributes or {})["gen_ai.output.messages"]))
    assert run_output[0]["parts"] == [{"type": "text", "content": "the value"}]
    chat_attrs = dict(first.attributes or {})
    assert SECRET_PROMPT in str(chat_attrs["gen_ai.input.messages"])
    assert "be brief" in str(chat_attrs["gen_ai.system_instructions"])
    assert SECRET_ARG in str(chat_attrs["gen_ai.output.messages"])
    call_attrs = dict(call.attributes or {})
    assert json.loads(str(call_attrs["gen_ai.tool.call.arguments"])) == {"key": SECRET_ARG}
    assert call_attrs["gen_ai.tool.call.result"] == f"value of {SECRET_ARG}"


async def test_media_parts_are_recorded_by_reference_never_their_bytes(
    exporter: InMemorySpanExporter,
) -> None:
    image = big_png(200_000)

    @tool
    def screenshot() -> ImagePart:
        """Take a screenshot."""
        return ImagePart(media_type="image/png", data=image)

    model = ScriptedModel([tool_call_turn("screenshot", call_id="c1"), "seen"])
    agent = AgentCore(model, tools=[screenshot], tracer=tracer_for(exporter, content=True))
    prompt: list[ContentPart] = [TextPart("look"), ImagePart(media_type="image/png", data=image)]
    async for _ in agent.stream(prompt, config=AgentRunConfig(session_id="s1")):
        pass
    spans = exporter.get_finished_spans()
    text = all_attribute_text(spans)
    assert len(text) < 10_000
    assert base64.b64encode(image[:3000]).decode("ascii")[:100] not in text
    second = max(by_name(spans, "chat "), key=lambda s: s.start_time or 0)
    sent = json.loads(str((second.attributes or {})["gen_ai.input.messages"]))
    ref = "sha256:" + hashlib.sha256(image).hexdigest()
    described = {"type": "file", "file_id": ref, "modality": "image", "mime_type": "image/png"}
    assert sent[0] == {"role": "user", "parts": [{"type": "text", "content": "look"}, described]}
    assert sent[-1]["parts"][1:] == [described]
    [call] = by_name(spans, "execute_tool ")
    assert ref in str((call.attributes or {})["gen_ai.tool.call.result"])


async def test_a_failed_model_call_marks_its_span_and_the_run(
    exporter: InMemorySpanExporter,
) -> None:
    failure = ProviderError("upstream said no", status_code=400, reason="bad_request")
    agent = AgentCore(ScriptedModel([failure]), tracer=tracer_for(exporter))
    events = []
    with pytest.raises(ProviderError):
        async for event in agent.stream("hi", config=AgentRunConfig(session_id="s1")):
            events.append(event)
    assert events[-1].type is AgentEventType.RUN_FAILED
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    [chat] = by_name(spans, "chat ")
    for span in (run, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "upstream said no"
        assert (span.attributes or {})["error.type"] == "provider_error"
    assert (chat.attributes or {})["agent_runtime.error.reason"] == "bad_request"


async def test_a_retried_call_is_a_span_per_attempt(exporter: InMemorySpanExporter) -> None:
    from agent_runtime.model import RetryOptions

    flaky = ProviderError("try again", retryable=True, status_code=503)
    model = ScriptedModel(
        [flaky, "fine"], retry=RetryOptions(max_retries=1, initial_delay=0.0, max_delay=0.0)
    )
    agent = AgentCore(model, tracer=tracer_for(exporter))
    await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    chats = sorted(by_name(spans, "chat "), key=lambda s: s.start_time or 0)
    assert [c.status.status_code for c in chats] == [StatusCode.ERROR, StatusCode.UNSET]
    [run] = by_name(spans, "invoke_agent ")
    assert run.status.status_code is StatusCode.OK


async def test_a_failing_tool_marks_its_span_without_its_text(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel([tool_call_turn("broken", {"key": SECRET_ARG}, call_id="c9"), "sorry"])
    agent = AgentCore(model, tools=[broken], tracer=tracer_for(exporter))
    await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    [call] = by_name(spans, "execute_tool ")
    assert call.status.status_code is StatusCode.ERROR
    assert (call.attributes or {})["error.type"] == "tool_error"
    assert SECRET_ARG not in all_attribute_text(spans)
    [run] = by_name(spans, "invoke_agent ")
    assert run.status.status_code is StatusCode.OK  # the model got the error and answered


async def test_the_confirmation_wait_is_a_pair_of_events_on_the_run(
    exporter: InMemorySpanExporter,
) -> None:
    model = ScriptedModel([tool_call_turn("lookup", {"key": SECRET_ARG}, call_id="c1"), "done"])
    agent = AgentCore(
        model,
        tools=[lookup],
        extensions=[ConfirmationExtension(timeout=60)],
        tool_policies={"lookup": ToolPolicy.ASK},
        tracer=tracer_for(exporter),
    )
    config = AgentRunConfig(session_id="s1")
    stream = agent.stream("go", config=config)
    async for event in stream:
        if event.type is AgentEventType.CUSTOM and event.name == "confirmation_requested":
            break
    answer = ExternalEvent(CONFIRMATION_RESPONSE, {"tool_call_id": "c1", "approved": True})
    assert agent.emit_external_event(answer, config=config)
    async for _ in stream:
        pass
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    [call] = by_name(spans, "execute_tool ")
    requested, resolved = run.events
    assert requested.name == "confirmation_requested"
    assert dict(requested.attributes or {})["gen_ai.tool.call.id"] == "c1"
    assert dict(requested.attributes or {})["gen_ai.tool.name"] == "lookup"
    assert "agent_runtime.confirmation.expires_at" in (requested.attributes or {})
    assert resolved.name == "confirmation_resolved"
    assert dict(resolved.attributes or {})["agent_runtime.confirmation.outcome"] == "approved"
    # the wait happened before the tool ran; the question and arguments stay out
    assert requested.timestamp <= resolved.timestamp <= (call.start_time or 0)
    assert SECRET_ARG not in all_attribute_text(spans)


async def test_the_run_joins_the_trace_current_where_it_started(
    exporter: InMemorySpanExporter,
) -> None:
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    agent = AgentCore(ScriptedModel(["hello"]), tracer=tracer_for(exporter))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    finally:
        otel_context.detach(token)
    [run] = by_name(exporter.get_finished_spans(), "invoke_agent ")
    assert run.context.trace_id == remote.trace_id
    assert run.parent is not None and run.parent.span_id == remote.span_id


async def test_a_cancelled_run_ends_its_spans_without_an_error(
    exporter: InMemorySpanExporter,
) -> None:
    release = asyncio.Event()

    async def slow(request: object) -> str:
        await release.wait()
        return "never"

    tracer = tracer_for(exporter)
    agent = AgentCore(ScriptedModel([slow]), tracer=tracer)
    config = AgentRunConfig(session_id="s1", run_id="run_c")
    stream = agent.stream("hi", config=config)
    started = await anext(stream)
    assert started.type is AgentEventType.RUN_STARTED
    assert tracer.run_span_context("run_c") is not None
    assert agent.cancel_run("run_c")
    with pytest.raises(RunCancelledError):
        async for _ in stream:
            pass
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    [chat] = by_name(spans, "chat ")
    assert run.status.status_code is StatusCode.UNSET
    assert (run.attributes or {})["agent_runtime.run.cancel_reason"] == "cancel_requested"
    assert chat.end_time is not None
    assert tracer.run_span_context("run_c") is None


async def test_without_a_tracer_nothing_is_recorded(exporter: InMemorySpanExporter) -> None:
    agent = AgentCore(tool_turn_model(), tools=[lookup])
    await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    assert exporter.get_finished_spans() == ()


async def test_parallel_tool_calls_are_sibling_spans_of_the_run(
    exporter: InMemorySpanExporter,
) -> None:
    turn = AssistantMessage(
        None, [ToolCall("c1", "lookup", {"key": "a"}), ToolCall("c2", "lookup", {"key": "b"})]
    )
    agent = AgentCore(
        ScriptedModel([turn, "both"]),
        tools=[lookup],
        parallel_tool_calls=True,
        tracer=tracer_for(exporter),
    )
    await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    calls = by_name(spans, "execute_tool ")
    assert sorted(str((c.attributes or {})["gen_ai.tool.call.id"]) for c in calls) == ["c1", "c2"]
    assert all(c.parent is not None and c.parent.span_id == run.context.span_id for c in calls)


async def test_a_run_past_its_deadline_is_an_error_span(exporter: InMemorySpanExporter) -> None:
    async def never(request: object) -> str:
        await asyncio.Event().wait()
        return "never"

    agent = AgentCore(ScriptedModel([never]), run_timeout=0.05, tracer=tracer_for(exporter))
    with pytest.raises(RunTimeoutError):
        await run_to_end(agent, "hi", AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent ")
    [chat] = by_name(spans, "chat ")
    assert run.status.status_code is StatusCode.ERROR
    assert (run.attributes or {})["error.type"] == "run_timeout"
    # the call was cut by the deadline's cancellation: ended, not marked as its own failure
    assert chat.end_time is not None and chat.status.status_code is StatusCode.UNSET


async def test_cache_and_reasoning_counts_are_span_attributes_where_reported(
    exporter: InMemorySpanExporter,
) -> None:
    detailed = Usage(100, 9, cached_input_tokens=80, cache_write_tokens=15, reasoning_tokens=4)
    model = ScriptedModel(
        [
            tool_call_turn("lookup", {"key": "k"}, call_id="c1"),  # reports no details
            ModelResponse(AssistantMessage("the value"), detailed, "stop"),
        ]
    )
    agent = AgentCore(model, tools=[lookup], tracer=tracer_for(exporter))
    await run_to_end(agent, "look", AgentRunConfig(session_id="s1"))
    spans = exporter.get_finished_spans()
    [run] = by_name(spans, "invoke_agent")
    first, second = sorted(by_name(spans, "chat "), key=lambda s: s.start_time or 0)
    details = {
        "gen_ai.usage.cache_read.input_tokens": 80,
        "gen_ai.usage.cache_creation.input_tokens": 15,
        "gen_ai.usage.reasoning.output_tokens": 4,
    }
    assert {k: v for k, v in (second.attributes or {}).items() if k in details} == details
    assert not set(first.attributes or {}) & set(details)
    # the run's total: the reported details summed
    assert {k: v for k, v in (run.attributes or {}).items() if k in details} == details
