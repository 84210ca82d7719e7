"""An answer and a hand-over racing at a run's wait: exactly one of them wins, and the answer
is never lost.

A run waiting for an approval is handed over (``cancel_run(run_id, "handover")``) while an
answer may be arriving. The hand-over is refused once the run took an answer its checkpoint
does not record yet (the run goes on here and uses it); once the hand-over is granted, the
run takes no answer (its sender is refused and posts it again where the run resumes).
"""

from __future__ import annotations

import asyncio

import pytest

from agent_runtime import AgentCore, AgentEvent, AgentEventType, RunCancelledError
from agent_runtime.extensions.confirmation import CONFIRMATION_REQUESTED
from agent_runtime.run_context import HANDOVER
from agent_runtime.testing import tool_call_turn
from tests.support.checkpoints import CONFIG, Effects, Sink, answer, ask_agent


def _asks(event: AgentEvent) -> bool:
    return event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED


async def test_a_run_that_took_an_answer_is_not_handed_over_and_uses_it() -> None:
    effects = Effects()
    core = ask_agent(effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9"), "Sent."])
    events: list[AgentEvent] = []
    async for event in core.stream("mail ada", config=CONFIG, checkpoint_sink=Sink()):
        events.append(event)
        if _asks(event):
            # the answer is claimed (its delivery queued on the loop), then, before the run
            # wakes to take it, the drain asks for the hand-over
            assert core.emit_external_event(answer("c9", True), config=CONFIG)
            assert core.cancel_run("run_1", HANDOVER) is False
    assert effects.sent == ["ada"]
    assert events[-1].type is AgentEventType.RUN_COMPLETED


async def test_a_run_being_handed_over_takes_no_answer() -> None:
    effects = Effects()
    core = ask_agent(effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9")])
    events: list[AgentEvent] = []
    with pytest.raises(RunCancelledError, match="handover"):
        async for event in core.stream("mail ada", config=CONFIG, checkpoint_sink=Sink()):
            events.append(event)
            if _asks(event):
                assert core.cancel_run("run_1", HANDOVER) is True
                # too late for this worker: refused, to be posted where the run resumes
                assert core.emit_external_event(answer("c9", True), config=CONFIG) == []
    assert effects.sent == []
    assert events[-1].type is AgentEventType.RUN_CANCELLED
    assert events[-1].reason == HANDOVER


def _post(core: AgentCore, accepted: list[list[str]]) -> None:
    accepted.append(core.emit_external_event(answer("c9", True), config=CONFIG))


async def test_an_answer_from_another_thread_and_the_hand_over_never_both_win() -> None:
    # many rounds of the race with the answer sent from a thread, as a request handler of a
    # sync front end would: each round, the answer is used here or refused, never both lost
    for _ in range(50):
        effects = Effects()
        core = ask_agent(
            effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9"), "Sent."]
        )
        accepted: list[list[str]] = []
        handed_over = False
        events: list[AgentEvent] = []
        try:
            async for event in core.stream("mail ada", config=CONFIG, checkpoint_sink=Sink()):
                events.append(event)
                if _asks(event):
                    task = asyncio.ensure_future(asyncio.to_thread(_post, core, accepted))
                    await asyncio.sleep(0)
                    handed_over = core.cancel_run("run_1", HANDOVER)
                    await task
        except RunCancelledError:
            assert handed_over
        took = bool(accepted[0])
        assert took is not handed_over  # exactly one of them
        assert effects.sent == (["ada"] if took else [])
        await core.aclose()
