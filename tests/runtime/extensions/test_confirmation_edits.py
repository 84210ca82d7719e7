"""An approval may edit a call's arguments, where the tool allows it: the tool runs with the
edited arguments, and the run's conversation, checkpoints and events say so. An edit the tool
does not allow, or arguments it cannot take, are refused with a typed error and use up nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, AgentRunConfig, tool
from agent_runtime.agent import AgentRunContext
from agent_runtime.errors import AnswerRefusedError, EditNotAllowedError, InvalidEditError
from agent_runtime.extensions.base import AgentExtension
from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESOLVED,
    CONFIRMATION_RESPONSE,
    ConfirmationExtension,
)
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.messages import AssistantMessage, ToolCall
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.checkpoints import Sink

CONFIG = AgentRunConfig(session_id="s1", run_id="run_1")


class Files:
    """Two ``ask`` tools with visible effects: one whose arguments may be edited, one not."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []
        self.deleted: list[str] = []

        @tool(policy="ask", editable=True)
        def write_file(path: str, copies: int = 1) -> str:
            """Write a file."""
            self.written.append((path, copies))
            return f"wrote {path} x{copies}"

        @tool(policy="ask")
        def delete_file(path: str) -> str:
            """Delete a file."""
            self.deleted.append(path)
            return f"deleted {path}"

        self.tools = [write_file, delete_file]


def approve(call_id: str, arguments: Any = None, *, approved: bool = True) -> ExternalEvent:
    payload: dict[str, Any] = {"tool_call_id": call_id, "approved": approved}
    if arguments is not None:
        payload["arguments"] = arguments
    return ExternalEvent(CONFIRMATION_RESPONSE, payload)


def make_agent(files: Files, turns: list[Any]) -> tuple[AgentCore, ScriptedModel]:
    model = ScriptedModel(turns)
    agent = AgentCore(model, tools=files.tools, extensions=[ConfirmationExtension(timeout=30)])
    return agent, model


def tool_calls_of(message: object) -> list[ToolCall]:
    assert isinstance(message, AssistantMessage)
    return message.tool_calls


async def test_an_edited_approval_runs_the_tool_with_the_edited_arguments() -> None:
    files = Files()
    turn = tool_call_turn("write_file", {"path": "a.txt"}, call_id="c1")
    agent, model = make_agent(files, [turn, "done"])
    events: list[AgentEvent] = []
    async for event in agent.stream("write", config=CONFIG):
        events.append(event)
        if event.name == CONFIRMATION_REQUESTED:
            assert event.payload is not None and event.payload["editable"] is True
            edited = approve("c1", {"path": "b.txt", "copies": 2})
            assert agent.emit_external_event(edited, config=CONFIG) == ["ConfirmationExtension"]
    assert files.written == [("b.txt", 2)]
    resolved = next(e for e in events if e.name == CONFIRMATION_RESOLVED)
    assert resolved.payload == {
        "tool_call_id": "c1",
        "outcome": "approved",
        "edited": True,
        "arguments": {"path": "b.txt", "copies": 2},
    }
    started = next(e for e in events if e.type is AgentEventType.TOOL_CALL_STARTED)
    assert started.data()["arguments"] == {"path": "a.txt"}  # what the model asked for
    completed = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert completed.data() == {
        "tool_call_id": "c1",
        "name": "write_file",
        "is_error": False,
        "result": "wrote b.txt x2",
        "arguments": {"path": "b.txt", "copies": 2},
        "edited": True,
    }
    # the model's next turn sees the call as it ran, and so does the stored conversation
    seen = [m for m in model.requests[1].messages if isinstance(m, AssistantMessage)]
    assert tool_calls_of(seen[-1])[0].arguments == {"path": "b.txt", "copies": 2}
    ended = events[-1]
    assert ended.type is AgentEventType.RUN_COMPLETED and ended.messages is not None
    assert tool_calls_of(ended.messages[1])[0].arguments == {"path": "b.txt", "copies": 2}
    model.assert_consumed()


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"path": "b.txt", "copies": "many"}, "copies"),
        ({"copies": 2}, "path"),
        ({"path": "b.txt", "mode": "w"}, "mode"),
        (["b.txt"], "object"),
    ],
)
async def test_invalid_edited_arguments_are_refused_and_the_call_keeps_waiting(
    arguments: Any, problem: str
) -> None:
    files = Files()
    turn = tool_call_turn("write_file", {"path": "a.txt"}, call_id="c1")
    agent, _ = make_agent(files, [turn, "done"])
    extension = agent.extensions[0]
    assert isinstance(extension, ConfirmationExtension)
    async for event in agent.stream("write", config=CONFIG):
        if event.name == CONFIRMATION_REQUESTED:
            with pytest.raises(InvalidEditError, match=problem) as refused:
                agent.emit_external_event(approve("c1", arguments), config=CONFIG)
            assert refused.value.code == "invalid_arguments"
            assert extension.is_waiting("s1", "c1")  # nothing used up
            assert agent.emit_external_event(approve("c1", {"path": "c.txt"}), config=CONFIG)
    assert files.written == [("c.txt", 1)]


async def test_an_edit_of_a_tool_that_allows_none_is_refused() -> None:
    files = Files()
    turn = tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1")
    agent, _ = make_agent(files, [turn, "done"])
    async for event in agent.stream("delete", config=CONFIG):
        if event.name == CONFIRMATION_REQUESTED:
            assert event.payload is not None and "editable" not in event.payload
            with pytest.raises(EditNotAllowedError) as refused:
                agent.emit_external_event(approve("c1", {"path": "b.txt"}), config=CONFIG)
            assert refused.value.code == "edit_not_allowed"
            assert isinstance(refused.value, AnswerRefusedError)
            assert agent.emit_external_event(approve("c1"), config=CONFIG)
    assert files.deleted == ["a.txt"]  # the call as the model made it


async def test_edited_arguments_with_a_denial_are_refused() -> None:
    files = Files()
    turn = tool_call_turn("write_file", {"path": "a.txt"}, call_id="c1")
    agent, _ = make_agent(files, [turn, "done"])
    async for event in agent.stream("write", config=CONFIG):
        if event.name == CONFIRMATION_REQUESTED:
            denial = approve("c1", {"path": "b.txt"}, approved=False)
            with pytest.raises(InvalidEditError, match="approval"):
                agent.emit_external_event(denial, config=CONFIG)
            assert agent.emit_external_event(approve("c1", approved=False), config=CONFIG)
    assert files.written == []


async def test_the_same_arguments_are_a_plain_approval() -> None:
    files = Files()
    turn = tool_call_turn("write_file", {"path": "a.txt"}, call_id="c1")
    agent, _ = make_agent(files, [turn, "done"])
    events: list[AgentEvent] = []
    async for event in agent.stream("write", config=CONFIG):
        events.append(event)
        if event.name == CONFIRMATION_REQUESTED:
            assert agent.emit_external_event(approve("c1", {"path": "a.txt"}), config=CONFIG)
    resolved = next(e for e in events if e.name == CONFIRMATION_RESOLVED)
    assert resolved.payload == {"tool_call_id": "c1", "outcome": "approved"}
    completed = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert "edited" not in completed.data()
    assert files.written == [("a.txt", 1)]


async def test_the_checkpoint_holds_the_edit_and_a_resumed_run_runs_it() -> None:
    files = Files()
    turn = tool_call_turn("write_file", {"path": "a.txt"}, call_id="c1")
    agent, _ = make_agent(files, [turn])
    sink = Sink()
    stream = agent.stream("write", config=CONFIG, checkpoint_sink=sink)
    async for event in stream:
        if event.name == CONFIRMATION_REQUESTED:
            assert agent.emit_external_event(approve("c1", {"path": "b.txt"}), config=CONFIG)
        if event.type is AgentEventType.TOOL_CALL_COMPLETED:
            break  # the worker dies before the model's next turn
    await stream.aclose()  # type: ignore[attr-defined]
    await agent.aclose()
    approved = next(c for c in sink.saved if [k.state for k in c.calls] == ["approved"])
    assert approved.open_calls() == [(ToolCall("c1", "write_file", {"path": "b.txt"}), "approved")]
    # another worker resumes from the approval: it runs what was approved, no question asked
    again = Files()
    resumed, model = make_agent(again, ["done"])
    events = [e async for e in resumed.resume(approved, checkpoint_sink=Sink())]
    assert again.written == [("b.txt", 1)]
    assert not [e for e in events if e.name == CONFIRMATION_REQUESTED]
    seen = [m for m in model.requests[0].messages if isinstance(m, AssistantMessage)]
    assert tool_calls_of(seen[-1])[0].arguments == {"path": "b.txt"}


class _EditingApprover(AgentExtension):
    """Approves every call with edited arguments, whether its tool allows edits or not."""

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        context.set_tool_decision(call.id, True, arguments={"path": "elsewhere.txt"})


async def test_the_runtime_denies_an_edit_an_extension_records_for_a_tool_that_allows_none() -> (
    None
):
    files = Files()
    turn = tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1")
    agent = AgentCore(
        ScriptedModel([turn, "done"]), tools=files.tools, extensions=[_EditingApprover()]
    )
    events = [e async for e in agent.stream("delete", config=CONFIG)]
    completed = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert completed.is_error and "does not allow its arguments to be edited" in (
        completed.error or ""
    )
    assert files.deleted == []
