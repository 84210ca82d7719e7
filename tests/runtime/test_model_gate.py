"""``model_gate``: the run's last word before each model call of its loop."""

from __future__ import annotations

import pytest

from agent_runtime import AgentCore
from agent_runtime.agent import AgentRunContext
from agent_runtime.errors import RunError
from agent_runtime.events import AgentEvent, AgentEventType
from agent_runtime.testing import ScriptedModel, Turn, tool_call_turn
from agent_runtime.tools.base import tool


class Stopped(RunError):
    code = "budget_exceeded"


@tool
def lookup() -> str:
    """Look something up."""
    return "found"


def _calls(count: int) -> list[Turn]:
    return [tool_call_turn("lookup", {}, call_id=f"c{i}") for i in range(count)]


async def test_the_gate_is_awaited_before_every_model_call() -> None:
    model = ScriptedModel([*_calls(2), "done"])
    seen: list[int] = []

    async def gate(context: AgentRunContext) -> None:
        seen.append(len(model.requests))

    agent = AgentCore(model, tools=[lookup])
    assert (await agent.chat("x", model_gate=gate)).content == "done"
    assert seen == [0, 1, 2]  # before each of the three calls, none after the last
    model.assert_consumed()


async def test_a_run_error_from_the_gate_fails_the_run_before_the_call() -> None:
    model = ScriptedModel([*_calls(1), "never asked for"])

    async def gate(context: AgentRunContext) -> None:
        if context.state.usage.input_tokens + context.state.usage.output_tokens > 0:
            raise Stopped("the budget is used up")

    agent = AgentCore(model, tools=[lookup])
    events: list[AgentEvent] = []
    with pytest.raises(Stopped):
        async for event in agent.stream("x", model_gate=gate):
            events.append(event)
    failed = events[-1]
    assert failed.type is AgentEventType.RUN_FAILED
    assert failed.data()["error"]["code"] == "budget_exceeded"
    assert len(model.requests) == 1  # the second call was never made
