"""A denial may carry a reply (Agent Inbox's ``response``): the tool does not run and the model
gets the person's words in its place. A reply that is not text, or comes with an approval, is
refused with a typed error and uses up nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentRunConfig, tool
from agent_runtime.errors import AnswerRefusedError, InvalidReplyError
from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESOLVED,
    CONFIRMATION_RESPONSE,
    ConfirmationExtension,
)
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.extensions.replies import MAX_REPLY
from agent_runtime.messages import ToolMessage
from agent_runtime.testing import ScriptedModel, tool_call_turn

CONFIG = AgentRunConfig(session_id="s1", run_id="run_1")


def answer(approved: bool, reply: Any) -> ExternalEvent:
    payload = {"tool_call_id": "c1", "approved": approved, "response": reply}
    return ExternalEvent(CONFIRMATION_RESPONSE, payload)


def make_agent(deleted: list[str]) -> tuple[AgentCore, ScriptedModel]:
    @tool(policy="ask")
    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    turn = tool_call_turn("delete_file", {"path": "a.txt"}, call_id="c1")
    model = ScriptedModel([turn, "understood"])
    agent = AgentCore(model, tools=[delete_file], extensions=[ConfirmationExtension(timeout=30)])
    return agent, model


async def test_a_reply_takes_the_calls_place() -> None:
    deleted: list[str] = []
    agent, model = make_agent(deleted)
    events: list[AgentEvent] = []
    async for event in agent.stream("delete", config=CONFIG):
        events.append(event)
        if event.name == CONFIRMATION_REQUESTED:
            reply = answer(False, "not that one, the old copy")
            assert agent.emit_external_event(reply, config=CONFIG) == ["ConfirmationExtension"]
    assert deleted == []
    resolved = next(e for e in events if e.name == CONFIRMATION_RESOLVED)
    assert resolved.payload == {
        "tool_call_id": "c1",
        "outcome": "denied",
        "response": "not that one, the old copy",
    }
    result = next(m for m in model.requests[1].messages if isinstance(m, ToolMessage))
    assert result.is_error and "not that one, the old copy" in result.content
    model.assert_consumed()


@pytest.mark.parametrize(
    ("approved", "reply", "problem"),
    [
        (True, "go ahead", "denial"),
        (False, "", "non-empty"),
        (False, 42, "text"),
        (False, "x" * (MAX_REPLY + 1), "at most"),
    ],
)
async def test_a_reply_that_cannot_be_passed_on_is_refused(
    approved: bool, reply: Any, problem: str
) -> None:
    deleted: list[str] = []
    agent, _ = make_agent(deleted)
    extension = agent.extensions[0]
    assert isinstance(extension, ConfirmationExtension)
    async for event in agent.stream("delete", config=CONFIG):
        if event.name == CONFIRMATION_REQUESTED:
            with pytest.raises(InvalidReplyError, match=problem) as refused:
                agent.emit_external_event(answer(approved, reply), config=CONFIG)
            assert refused.value.code == "invalid_response"
            assert isinstance(refused.value, AnswerRefusedError)
            assert extension.is_waiting("s1", "c1")  # nothing used up
            approval = ExternalEvent(
                CONFIRMATION_RESPONSE, {"tool_call_id": "c1", "approved": True}
            )
            assert agent.emit_external_event(approval, config=CONFIG)
    assert deleted == ["a.txt"]
