"""ConfirmationExtension reports each decision with a confirmation_resolved custom event; a
waiting run tells whether its reader has taken the question yet."""

from __future__ import annotations

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, AgentPhase, AgentRunConfig, tool
from agent_runtime.extensions.confirmation import ConfirmationExtension
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.waiting import wait_until


@tool(policy="ask")
def launch() -> str:
    """Needs a person's approval."""
    return "launched"


@pytest.mark.parametrize(
    ("answer", "outcome"), [(True, "approved"), (False, "denied"), (None, "expired")]
)
async def test_each_decision_is_reported(answer: bool | None, outcome: str) -> None:
    timeout = 0.05 if answer is None else 30.0
    extension = ConfirmationExtension(timeout=timeout)
    agent = AgentCore(
        ScriptedModel([tool_call_turn("launch", call_id="c1"), "done"]),
        tools=[launch],
        extensions=[extension],
    )
    config = AgentRunConfig(session_id="s")
    events: list[AgentEvent] = []
    async for event in agent.stream("go", config=config):
        events.append(event)
        if event.name == "confirmation_requested" and answer is not None:
            reply = ExternalEvent(
                "confirmation_response", {"tool_call_id": "c1", "approved": answer}
            )
            assert agent.emit_external_event(reply, config=config) == ["ConfirmationExtension"]
    names = [e.name for e in events if e.type is AgentEventType.CUSTOM]
    assert names == ["confirmation_requested", "confirmation_resolved"]
    resolved = next(e for e in events if e.name == "confirmation_resolved")
    assert resolved.payload == {"tool_call_id": "c1", "outcome": outcome}
    done = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert done.is_error is (outcome != "approved")
    assert extension.pending_count() == 0 and extension.staged_count() == 0
    assert not extension._run_waits and not extension._staged  # both indexes are emptied


async def test_a_waiting_run_counts_the_question_its_reader_has_not_taken() -> None:
    agent = AgentCore(
        ScriptedModel([tool_call_turn("launch", call_id="c1"), "done"]),
        tools=[launch],
        extensions=[ConfirmationExtension(timeout=30.0)],
    )
    config = AgentRunConfig(session_id="s", run_id="r1")
    stream = agent.stream("go", config=config)
    taken = [await anext(stream)]
    run = agent.active_runs["r1"]
    while taken[-1].type is not AgentEventType.TOOL_CALL_STARTED:
        taken.append(await anext(stream))
    # the reader stops there; the run asks and waits, its question not taken yet
    await wait_until(lambda: run.phase is AgentPhase.WAITING)
    assert run.undelivered == 1
    taken.append(await anext(stream))
    assert taken[-1].name == "confirmation_requested"
    assert run.undelivered == 0
    reply = ExternalEvent("confirmation_response", {"tool_call_id": "c1", "approved": True})
    assert agent.emit_external_event(reply, config=config) == ["ConfirmationExtension"]
    taken.extend([event async for event in stream])
    assert [event.type for event in taken][-1] is AgentEventType.RUN_COMPLETED
