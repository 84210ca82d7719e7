"""The protocols' translations of a run's wire events, on logs written here.

The end-to-end suites (``tests/e2e/test_openai.py``, ``test_a2a.py``, ``test_mcp_server.py``)
drive them with the official clients; these check the properties that a client sees only
by chance: a resumed Responses stream is the same stream, the ids round-trip, a stretch of a
run ends at its question.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from a2a.types import a2a_pb2 as pb
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from app.http.protocols.a2a.tasks import TaskBuilder
from app.http.protocols.openai.chat import ChatBuilder
from app.http.protocols.openai.response_events import (
    ResponseBuilder,
    approval_item_id,
    format_response_id,
    parse_response_id,
    tool_call_of_approval,
)

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
RUN = "run_" + "ab" * 16


def log(*events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"type": type_, "seq": seq, "ts": "2026-11-30T12:00:00.000Z", "data": data}
        for seq, (type_, data) in enumerate(events, start=1)
    ]


CALL = {"tool_call_id": "call_1", "name": "delete_file"}
ASK = {"tool_call_id": "call_1", "tool": "delete_file", "arguments": {"path": "a"}}

DELETE_RUN = log(
    ("run.started", {"agent": "default", "model": "demo"}),
    ("text.delta", {"delta": "Let me "}),
    ("text.delta", {"delta": "check."}),
    (
        "tool.call.started",
        {"tool_call_id": "call_1", "name": "delete_file", "arguments": {"path": "a"}},
    ),
    (
        "custom",
        {
            "name": "confirmation_requested",
            "payload": {
                "tool_call_id": "call_1",
                "tool": "delete_file",
                "arguments": {"path": "a"},
            },
        },
    ),
    ("custom", {"name": "confirmation_resolved", "payload": {"tool_call_id": "call_1"}}),
    (
        "tool.call.completed",
        {"tool_call_id": "call_1", "name": "delete_file", "result": "Deleted a"},
    ),
    ("text.delta", {"delta": "Deleted a."}),
    ("usage", {"model_call_id": "m", "input_tokens": 3, "output_tokens": 2}),
    ("run.completed", {"output": {"content": "Deleted a."}, "usage": {}}),
)


def frames(builder: ResponseBuilder, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = builder.opening() + b"".join(builder.feed(d) for d in documents if not builder.done)
    events = []
    for chunk in body.decode().split("\n\n"):
        if chunk:
            event_line, data_line = chunk.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert event_line == f"event: {data['type']}"
            EVENTS.validate_python(data)
            events.append(data)
    return events


def builder(after: int = 0, **options: Any) -> ResponseBuilder:
    return ResponseBuilder(
        response_id=format_response_id(RUN, after),
        model="default",
        session_id="s",
        created_at=1_800_000_000.0,
        **options,
    )


def test_response_ids_round_trip() -> None:
    assert parse_response_id(format_response_id(RUN)) == (RUN, 0)
    assert parse_response_id(format_response_id(RUN, 5)) == (RUN, 5)
    for bad in ("run_x", "resp_", "resp_ab_x", "resp_a-b", "resp_ab_" + "9" * 19):
        assert parse_response_id(bad) is None
    assert tool_call_of_approval(approval_item_id("call_1")) == "call_1"
    assert tool_call_of_approval("call_1") is None


def test_a_response_ends_at_the_question_and_the_next_one_goes_on() -> None:
    first = frames(builder(stream=True), DELETE_RUN)
    assert first[-1]["type"] == "response.incomplete"
    final = first[-1]["response"]
    assert [item["type"] for item in final["output"]] == [
        "message",
        "function_call",
        "mcp_approval_request",
    ]
    assert final["output"][0]["content"][0]["text"] == "Let me check."
    assert final["output"][2]["id"] == approval_item_id("call_1")
    # the response after the answer reads the log from the question's seq
    second = frames(builder(5, stream=True), DELETE_RUN[5:])
    assert second[-1]["type"] == "response.completed"
    done = second[-1]["response"]
    assert [item["type"] for item in done["output"]] == ["function_call_output", "message"]
    assert done["usage"]["total_tokens"] == 5
    assert [e["sequence_number"] for e in second] == list(range(len(second)))


@pytest.mark.parametrize("cut", [0, 1, 3, 7, 12])
def test_a_resumed_stream_is_the_rest_of_the_same_stream(cut: int) -> None:
    whole = frames(builder(stream=True), DELETE_RUN[5:])
    rest = frames(builder(stream=True, starting_after=cut), DELETE_RUN[5:])
    assert rest == [e for e in whole if e["sequence_number"] > cut]


def test_a_response_not_streamed_makes_no_frames() -> None:
    quiet = builder()
    assert quiet.opening() == b""
    assert all(quiet.feed(d) == b"" for d in DELETE_RUN[5:])
    assert quiet.response()["status"] == "completed"


def test_a_failed_or_cancelled_run() -> None:
    failed = builder(stream=True)
    events = frames(
        failed, log(("run.failed", {"error": {"code": "run_timeout", "message": "late"}}))
    )
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == "run_timeout: late"
    cancelled = frames(builder(stream=True), log(("run.cancelled", {"reason": "cancel_requested"})))
    assert cancelled[-1]["type"] == "response.incomplete"
    assert cancelled[-1]["response"]["status"] == "cancelled"


def test_chat_chunks_and_the_confirmation_error() -> None:
    cancelled: list[bool] = []
    chat = ChatBuilder(
        completion_id="c",
        model="default",
        stream=True,
        include_usage=True,
        on_confirmation=lambda: cancelled.append(True),
    )
    body = chat.opening() + b"".join(chat.feed(d) for d in DELETE_RUN[:5])
    assert chat.done
    assert cancelled == [True]
    last = json.loads(body.decode().strip().split("\n\n")[-1].removeprefix("data: "))
    assert last["error"]["code"] == "confirmation_required"
    assert chat.result()[0] == 409


DETAILED = {
    "model_call_id": "m",
    "input_tokens": 100,
    "output_tokens": 30,
    "cached_input_tokens": 80,
    "cache_write_tokens": 15,
    "reasoning_tokens": 20,
}
REASONED_RUN = log(
    ("run.started", {"agent": "default", "model": "demo"}),
    ("reasoning.delta", {"delta": "The user "}),
    ("reasoning.delta", {"delta": "wants a."}),
    ("tool.call.started", {"tool_call_id": "c1", "name": "t", "arguments": {}}),
    ("usage", DETAILED),
    ("tool.call.completed", {"tool_call_id": "c1", "name": "t", "result": "r"}),
    ("reasoning.delta", {"delta": "Done."}),
    ("text.delta", {"delta": "Here "}),
    ("text.delta", {"delta": "it is."}),
    ("usage", DETAILED),
    ("run.completed", {"output": {"content": "Here it is."}, "usage": {}}),
)


def test_reasoning_is_a_reasoning_item_with_its_summary_before_what_it_leads_to() -> None:
    events = frames(builder(stream=True), REASONED_RUN)
    kinds = [e["type"] for e in events]
    assert kinds[2:9] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
    ]
    assert [e["delta"] for e in events if e["type"].endswith("summary_text.delta")] == [
        "The user ",
        "wants a.",
        "Done.",
    ]
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == [
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
    ]
    assert final["output"][0] == {
        "id": f"rs_{RUN.removeprefix('run_')}_2",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "The user wants a."}],
        "status": "completed",
    }
    assert final["usage"] == {
        "input_tokens": 200,
        "input_tokens_details": {"cached_tokens": 160, "cache_write_tokens": 30},
        "output_tokens": 60,
        "output_tokens_details": {"reasoning_tokens": 40},
        "total_tokens": 260,
    }
    # the same response, not streamed, and while the reasoning is being written
    quiet = builder()
    quiet.opening()
    for document in REASONED_RUN[:2]:
        quiet.feed(document)
    (thinking,) = quiet.response()["output"]
    assert (thinking["status"], thinking["summary"][0]["text"]) == ("in_progress", "The user ")
    # a run cut while its model reasons: the item is incomplete
    cut = frames(builder(stream=True), [*REASONED_RUN[:2], *log(("run.cancelled", {}))])
    assert cut[-1]["response"]["output"][0]["status"] == "incomplete"


def test_chat_carries_reasoning_as_reasoning_content_and_the_usage_details() -> None:
    chat = ChatBuilder(completion_id="c", model="default", stream=True, include_usage=True)
    body = chat.opening() + b"".join(chat.feed(d) for d in REASONED_RUN)
    chunks = [json.loads(c.removeprefix("data: ")) for c in body.decode().split("\n\n")[:-2]]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d["reasoning_content"] for d in deltas if "reasoning_content" in d] == [
        "The user ",
        "wants a.",
        "Done.",
    ]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 200,
        "completion_tokens": 60,
        "total_tokens": 260,
        "prompt_tokens_details": {"cached_tokens": 160, "cache_write_tokens": 30},
        "completion_tokens_details": {"reasoning_tokens": 40},
    }
    whole = ChatBuilder(completion_id="c", model="default")
    for document in REASONED_RUN:
        whole.feed(document)
    status, completion = whole.result()
    assert status == 200
    ChatCompletion.model_validate(completion)
    assert completion["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Here it is.",
        "refusal": None,
        "annotations": [],
        "reasoning_content": "The user wants a.Done.",
    }


def test_a2a_task_stops_at_the_question_and_resumes() -> None:
    task = TaskBuilder(run_id=RUN, session_id="s", input_text="delete a")
    events = [e for d in DELETE_RUN[:5] for e in task.feed(d)]
    assert task.done
    assert task.state == pb.TASK_STATE_INPUT_REQUIRED
    assert task.pending_call == "call_1"
    assert task.pending_seq == 5
    assert isinstance(events[-1], pb.TaskStatusUpdateEvent)
    task.resume()
    for document in DELETE_RUN[5:]:
        task.feed(document)
    assert task.state == pb.TASK_STATE_COMPLETED
    snapshot = task.task()
    assert [a.parts[0].text for a in snapshot.artifacts] == ["Let me check.", "Deleted a."]
    assert [m.role for m in snapshot.history] == [pb.ROLE_USER, pb.ROLE_AGENT]


def test_a2a_leaves_reasoning_out() -> None:
    task = TaskBuilder(run_id=RUN, session_id="s", input_text="a")
    events = [e for d in REASONED_RUN for e in task.feed(d)]
    assert task.state == pb.TASK_STATE_COMPLETED
    snapshot = task.task()
    assert [a.parts[0].text for a in snapshot.artifacts] == ["Here it is."]
    # no event, artifact or message says any of it
    said = "".join(str(e) for e in events) + str(snapshot)
    assert "The user" not in said and "Done." not in said
