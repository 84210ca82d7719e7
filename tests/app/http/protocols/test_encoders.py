"""The AG-UI and AI SDK encoders on hand-made logs: every shape of run our wire can carry.

Every AG-UI event is validated with ``ag-ui-protocol``'s own models (PyPI, the protocol's
Python SDK), and must carry nothing those models do not know.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.bus.base import WireEvent
from app.bus.wire import WireEncoder
from app.http.protocols.agui import AgUiEncoder
from app.http.protocols.ai_sdk import UIMessageStreamEncoder
from tests.support.agui import data_frames, validate_agui

RUN = "run_0123456789abcdef0123456789abcdef"


def _log(*events: tuple[str, dict[str, Any]]) -> list[WireEvent]:
    encoder = WireEncoder(RUN, "thread-1")
    return [encoder.encode(seq, kind, 1.0e9, data) for seq, (kind, data) in enumerate(events, 1)]


def agui(log: Sequence[WireEvent], *, after: int = 0, batch: int = 100) -> list[dict[str, Any]]:
    encoder = AgUiEncoder("thread-1", "client-run", RUN, after=after)
    body = b""
    events = [e for e in log if e.seq > after]
    for start in range(0, len(events), batch):
        body += encoder.encode(events[start : start + batch])
    if encoder.paused and not encoder.done:
        body += encoder.pause()
    assert encoder.done
    out = data_frames(body)
    validate_agui(out)
    return out


def ai_sdk(log: Sequence[WireEvent], *, after: int = 0) -> list[Any]:
    encoder = UIMessageStreamEncoder(RUN, after=after)
    body = encoder.encode([e for e in log if e.seq > after])
    if encoder.paused and not encoder.done:
        body += encoder.pause()
    assert encoder.done
    return data_frames(body)


STARTED = ("run.started", {"agent": "default", "model": "demo"})
ASKED = (
    "custom",
    {
        "name": "confirmation_requested",
        "payload": {
            "tool_call_id": "call_1",
            "tool": "delete_file",
            "arguments": {"path": "a"},
            "question": "Allow?",
            "response_event": "confirmation_response",
            "expires_at": "2026-12-01T00:00:00.000Z",
        },
    },
)
TOOL = (
    "tool.call.started",
    {"tool_call_id": "call_1", "name": "delete_file", "arguments": {"path": "a"}},
)


def _delta(text: str | None) -> tuple[str, dict[str, Any]]:
    return ("text.delta", {"delta": text})


def _usage(tokens_in: int, tokens_out: int) -> tuple[str, dict[str, Any]]:
    return ("usage", {"model_call_id": "m", "input_tokens": tokens_in, "output_tokens": tokens_out})


COMPLETED = ("run.completed", {"output": {"content": "ok"}, "usage": {}})


def test_agui_text_reuses_the_delta_string_and_closes_the_message() -> None:
    events = agui(
        _log(STARTED, _delta('He said "hi"\n'), _delta(None), _delta("é"), _usage(2, 3), COMPLETED)
    )
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert [e["delta"] for e in events[2:4]] == ['He said "hi"\n', "é"]
    assert events[0]["rawEvent"]["run_id"] == RUN
    assert events[-1]["usage"] == [
        {"inputTokens": 2, "outputTokens": 3, "totalTokens": 5, "model": "demo"}
    ]
    assert events[-1]["result"] == {"content": "ok"}


def test_agui_interrupt_then_resume_window() -> None:
    resolved = (
        "custom",
        {
            "name": "confirmation_resolved",
            "payload": {"tool_call_id": "call_1", "outcome": "approved"},
        },
    )
    done = (
        "tool.call.completed",
        {
            "tool_call_id": "call_1",
            "name": "delete_file",
            "is_error": False,
            "result": {"deleted": "a"},
        },
    )
    log = _log(STARTED, _delta("Sure"), TOOL, ASKED, resolved, done, _delta("Done"), COMPLETED)
    first = agui(log[:4])
    assert first[-1]["outcome"]["type"] == "interrupt"
    (interrupt,) = first[-1]["outcome"]["interrupts"]
    assert interrupt["id"] == interrupt["toolCallId"] == "call_1"
    assert interrupt["responseSchema"]["properties"] == {"approved": {"type": "boolean"}}
    start = next(e for e in first if e["type"] == "TOOL_CALL_START")
    assert start["parentMessageId"] == f"{RUN}:m2"  # the text the call came with
    rest = agui(log, after=4)
    assert rest[0]["rawEvent"] == {"run_id": RUN, "after": 4}
    result = next(e for e in rest if e["type"] == "TOOL_CALL_RESULT")
    assert json.loads(result["content"]) == {"deleted": "a"}
    assert rest[-1]["outcome"] == {"type": "success"}
    # a replay of the whole log goes through the answered confirmation
    whole = agui(log, batch=3)
    assert whole[-1]["outcome"] == {"type": "success"}


def test_agui_failure_cancel_resume_and_unknown_events() -> None:
    failed = agui(
        _log(
            STARTED,
            _delta("x"),
            ("run.failed", {"error": {"code": "run_timeout", "message": "too slow"}}),
        )
    )
    assert failed[-2:] == [
        {"type": "TEXT_MESSAGE_END", "messageId": f"{RUN}:m2"},
        {"type": "RUN_ERROR", "message": "too slow", "code": "run_timeout"},
    ]
    cancelled = agui(_log(STARTED, ("run.cancelled", {"reason": "cancel_requested"})))
    assert cancelled[-1]["outcome"] == {"type": "cancelled"}
    handed = agui(
        _log(
            STARTED,
            _delta("a"),
            ("run.resumed", {"reason": "worker_lost", "from_seq": 1}),
            _delta("a"),
            COMPLETED,
        )
    )
    assert [e["type"] for e in handed].count("TEXT_MESSAGE_START") == 2
    assert {
        "type": "CUSTOM",
        "name": "run.resumed",
        "value": {"reason": "worker_lost", "from_seq": 1},
    } in handed
    errored = agui(
        _log(
            STARTED,
            TOOL,
            (
                "tool.call.completed",
                {
                    "tool_call_id": "call_1",
                    "name": "delete_file",
                    "is_error": True,
                    "error": "boom",
                },
            ),
            COMPLETED,
        )
    )
    result = next(e for e in errored if e["type"] == "TOOL_CALL_RESULT")
    assert (result["content"], result["metadata"]) == ("boom", {"is_error": True})


def test_ai_sdk_steps_approval_and_denial() -> None:
    denied = (
        "custom",
        {
            "name": "confirmation_resolved",
            "payload": {"tool_call_id": "call_1", "outcome": "denied"},
        },
    )
    done = (
        "tool.call.completed",
        {"tool_call_id": "call_1", "name": "delete_file", "is_error": True, "error": "denied"},
    )
    log = _log(
        STARTED, _usage(1, 1), TOOL, ASKED, denied, done, _delta("No"), _usage(1, 1), COMPLETED
    )
    first = ai_sdk(log[:4])
    assert [c["type"] for c in first[:-1]] == [
        "start",
        "start-step",
        "tool-input-available",
        "tool-approval-request",
        "data-confirmation_requested",
        "finish-step",
        "finish",
    ]
    assert first[-1] == "[DONE]"
    assert first[0]["messageId"] == RUN
    assert first[3]["approvalId"] == first[3]["toolCallId"] == "call_1"
    assert first[-2]["finishReason"] == "tool-calls"
    rest = ai_sdk(log, after=4)
    kinds = [c["type"] for c in rest[:-1]]
    assert kinds == [
        "start",
        "tool-output-denied",
        "data-confirmation_resolved",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    assert rest[-2]["messageMetadata"]["usage"] == {
        "inputTokens": 1,
        "outputTokens": 1,
        "totalTokens": 2,
    }


def test_ai_sdk_failure_cancel_and_hand_over() -> None:
    failed = ai_sdk(
        _log(
            STARTED, _delta("x"), ("run.failed", {"error": {"code": "internal", "message": "oops"}})
        )
    )
    assert [c if c == "[DONE]" else c["type"] for c in failed][-5:] == [
        "text-end",
        "finish-step",
        "error",
        "finish",
        "[DONE]",
    ]
    cancelled = ai_sdk(_log(STARTED, _delta("x"), ("run.cancelled", {"reason": "shutdown"})))
    assert cancelled[-2] == {"type": "abort", "reason": "shutdown"}
    handed = ai_sdk(
        _log(
            STARTED,
            _delta("cut"),
            ("run.resumed", {"reason": "shutdown", "from_seq": 1}),
            _delta("again"),
            COMPLETED,
        )
    )
    kinds = [c if c == "[DONE]" else c["type"] for c in handed]
    assert kinds.index("reset-step") == kinds.index("text-end") + 1


def _thought(text: str | None) -> tuple[str, dict[str, Any]]:
    return ("reasoning.delta", {"delta": text})


DETAILED = (
    "usage",
    {
        "model_call_id": "m",
        "input_tokens": 100,
        "output_tokens": 30,
        "cached_input_tokens": 80,
        "cache_write_tokens": 15,
        "reasoning_tokens": 20,
        "model": "claude",
    },
)
# a model call that reasons, calls a tool, then one that reasons again and answers
REASONED = (
    STARTED,
    _thought("Let me "),
    _thought('check "it"'),
    TOOL,
    (
        "tool.call.completed",
        {"tool_call_id": "call_1", "name": "delete_file", "is_error": False, "result": "ok"},
    ),
    DETAILED,
    _thought(None),
    _thought("Done."),
    _delta("Deleted "),
    _delta("a"),
    DETAILED,
    COMPLETED,
)


def test_agui_reasoning_is_a_span_of_one_message_before_what_it_leads_to() -> None:
    events = agui(_log(*REASONED), batch=2)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    first, second = (e for e in events if e["type"] == "REASONING_MESSAGE_START")
    assert first == {
        "type": "REASONING_MESSAGE_START",
        "messageId": f"{RUN}:reasoning2",
        "role": "reasoning",
    }
    assert second["messageId"] == f"{RUN}:reasoning8"
    said = [e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT"]
    assert said == ["Let me ", 'check "it"', "Done."]
    assert events[-1]["usage"] == [
        {
            "inputTokens": 200,
            "outputTokens": 60,
            "cachedInputTokens": 160,
            "cacheWriteInputTokens": 30,
            "reasoningTokens": 40,
            "totalTokens": 260,
            "model": "claude",
        }
    ]
    # a run that ends (or waits) while its model reasons closes the span first
    cut = agui(_log(STARTED, _thought("hm"), ("run.cancelled", {"reason": "cancel_requested"})))
    assert [e["type"] for e in cut][-3:] == [
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "RUN_FINISHED",
    ]


def test_ai_sdk_reasoning_opens_its_step_and_usage_has_the_sdk_details() -> None:
    parts = ai_sdk(_log(*REASONED))
    kinds = [c if c == "[DONE]" else c["type"] for c in parts]
    assert kinds == [
        "start",
        "start-step",
        "reasoning-start",
        "reasoning-delta",
        "reasoning-delta",
        "reasoning-end",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "reasoning-start",
        "reasoning-delta",
        "reasoning-end",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
        "[DONE]",
    ]
    assert parts[2] == {"type": "reasoning-start", "id": f"{RUN}:reasoning2"}
    assert [c["delta"] for c in parts if c != "[DONE]" and c["type"] == "reasoning-delta"] == [
        "Let me ",
        'check "it"',
        "Done.",
    ]
    assert parts[-2]["messageMetadata"]["usage"] == {
        "inputTokens": 200,
        "outputTokens": 60,
        "totalTokens": 260,
        "inputTokenDetails": {"noCacheTokens": 10, "cacheReadTokens": 160, "cacheWriteTokens": 30},
        "outputTokenDetails": {"textTokens": 20, "reasoningTokens": 40},
    }
