"""Checkpoints and resume: what a run saves as it goes, and how a resumed run goes on."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    CheckpointError,
    RunCancelledError,
    RunCheckpoint,
)
from agent_runtime.checkpoints import CheckpointedCall
from agent_runtime.extensions.confirmation import (
    CONFIRMATION_REQUESTED,
    CONFIRMATION_RESOLVED,
    format_expiry,
)
from agent_runtime.messages import AssistantMessage, ToolCall, ToolMessage, message_to_dict
from agent_runtime.testing import ScriptedModel, tool_call_turn
from tests.support.checkpoints import CONFIG, Effects, Sink, answer, ask_agent


def two_tools() -> list[Any]:
    return [
        tool_call_turn("look_up", {"name": "ada"}, call_id="c1"),
        tool_call_turn("send_mail", {"to": "ada"}, call_id="c2"),
        "All done.",
    ]


def agent(effects: Effects, script: Sequence[Any], **kwargs: Any) -> AgentCore:
    return AgentCore(
        ScriptedModel(list(script)), tools=[effects.send_mail, effects.look_up], **kwargs
    )


async def run(core: AgentCore, **options: Any) -> list[AgentEvent]:
    return [event async for event in core.stream("mail ada", config=CONFIG, **options)]


def conversation(events: Sequence[AgentEvent]) -> list[dict[str, Any]]:
    terminal = events[-1]
    assert terminal.type is AgentEventType.RUN_COMPLETED, terminal
    return [message_to_dict(m) for m in terminal.messages or []]


async def test_a_checkpoint_after_each_response_before_each_effect_and_after_each_result() -> None:
    sink = Sink()
    events = await run(agent(Effects(), two_tools()), checkpoint_sink=sink)
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    shape = [(c.step, len(c.added), [(k.name, k.state) for k in c.calls]) for c in sink.saved]
    assert shape == [
        (1, 2, [("look_up", "pending")]),  # the first response: its call pending
        (2, 3, []),  # look_up's result (idempotent: no save before it ran)
        (3, 4, [("send_mail", "pending")]),
        (4, 4, [("send_mail", "started")]),  # before a call that must not run twice
        (5, 5, []),
        (6, 6, []),  # the answer
    ]
    assert sink.saved[-1].iteration == 3
    assert sink.saved[-1].usage.output_tokens > 0


async def test_no_sink_no_checkpoint_and_the_same_conversation() -> None:
    plain = conversation(await run(agent(Effects(), two_tools())))
    sunk = conversation(await run(agent(Effects(), two_tools()), checkpoint_sink=Sink()))
    assert plain == sunk


@pytest.mark.parametrize("step", [1, 2, 3, 5])
async def test_resume_from_any_checkpoint_gives_the_uninterrupted_conversation(step: int) -> None:
    whole = Sink()
    expected = conversation(await run(agent(Effects(), two_tools()), checkpoint_sink=whole))
    checkpoint = whole.saved[step - 1]
    effects = Effects()
    # the resumed run gets the model calls after the checkpoint's
    rest = two_tools()[checkpoint.iteration :]
    core = agent(effects, rest)
    events = [e async for e in core.resume(checkpoint, checkpoint_sink=Sink())]
    assert events[0].type is AgentEventType.RUN_RESUMED
    assert events[0].data()["from_step"] == step
    assert (events[0].run_id, events[0].session_id) == ("run_1", "s1")
    assert conversation(events) == expected
    assert events[-1].usage is not None
    assert events[-1].usage.output_tokens == whole.saved[-1].usage.output_tokens


async def test_a_started_call_is_not_run_again_and_its_outcome_is_unknown() -> None:
    whole = Sink()
    await run(agent(Effects(), two_tools()), checkpoint_sink=whole)
    started = whole.saved[3]  # send_mail started, its result not saved
    assert [(c.name, c.state) for c in started.calls] == [("send_mail", "started")]
    effects = Effects()
    core = agent(effects, ["Not sure it was sent."])
    events = [e async for e in core.resume(started)]
    assert effects.sent == []  # not a second mail
    completed = [e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert [(e.name, e.is_error) for e in completed] == [("send_mail", True)]
    assert "unknown" in (completed[0].error or "")
    # its tool.call.started was seen before the hand-over: not announced twice
    assert not [e for e in events if e.type is AgentEventType.TOOL_CALL_STARTED]
    result = conversation(events)[-2]
    assert result["role"] == "tool" and result["is_error"] is True


async def test_a_started_idempotent_call_runs_again() -> None:
    checkpoint = RunCheckpoint(
        run_id="run_1",
        session_id="s1",
        step=7,
        prompt="who is ada",
        added=(
            *_prompt("who is ada"),
            AssistantMessage(None, [ToolCall("c1", "look_up", {"name": "ada"})]),
        ),
        iteration=1,
        usage=_usage(),
        calls=(CheckpointedCall("c1", "look_up", "started"),),
    )
    effects = Effects()
    events = [e async for e in agent(effects, ["Ada is here."]).resume(checkpoint)]
    assert effects.looked == ["ada"]
    assert conversation(events)[-1]["content"] == "Ada is here."


def _prompt(text: str) -> list[Any]:
    from agent_runtime.messages import UserMessage

    return [UserMessage(text)]


def _usage() -> Any:
    from agent_runtime.model import Usage

    return Usage(3, 4, "scripted")


async def test_a_failing_sink_fails_the_run_with_its_error() -> None:
    effects = Effects()
    events: list[AgentEvent] = []
    with pytest.raises(RuntimeError, match="the store is gone"):
        async for event in agent(effects, two_tools()).stream(
            "mail ada", config=CONFIG, checkpoint_sink=Sink(fail_at=4)
        ):
            events.append(event)
    assert events[-1].type is AgentEventType.RUN_FAILED
    assert effects.sent == []  # the save before the mail failed: no mail


async def waiting_checkpoint(sink: Sink) -> RunCheckpoint:
    """Run until the mail waits for approval, then stop the run as a dying worker would."""
    effects = Effects()
    core = ask_agent(effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9")])
    stream = core.stream("mail ada", config=CONFIG, checkpoint_sink=sink)
    async for event in stream:
        if event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await core.aclose()
    waiting = sink.saved[-1]
    assert [(c.name, c.state) for c in waiting.calls] == [("send_mail", "awaiting_approval")]
    return waiting


async def test_a_call_waiting_for_approval_asks_again_and_goes_on() -> None:
    waiting = await waiting_checkpoint(Sink())
    effects = Effects()
    core = ask_agent(effects, ["Sent."])
    events: list[AgentEvent] = []
    async for event in core.resume(waiting, checkpoint_sink=Sink()):
        events.append(event)
        if event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED:
            assert event.payload is not None
            assert event.payload["resumed"] is True
            assert event.payload["tool_call_id"] == "c9"
            assert core.emit_external_event(answer("c9", True), config=CONFIG)
    assert effects.sent == ["ada"]
    assert conversation(events)[-1]["content"] == "Sent."


async def test_a_resumed_ask_keeps_the_expiry_it_was_first_made_with() -> None:
    sink = Sink()
    effects = Effects()
    core = ask_agent(effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9")])
    stream = core.stream("mail ada", config=CONFIG, checkpoint_sink=sink)
    first = ""
    async for event in stream:
        if event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED:
            assert event.payload is not None
            first = event.payload["expires_at"]
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await core.aclose()
    # the expiry was saved before the request was made
    waiting = sink.saved[-1]
    assert waiting.calls[0].expires_at is not None
    assert format_expiry(waiting.calls[0].expires_at) == first
    resumed = ask_agent(Effects(), ["Sent."])
    async for event in resumed.resume(waiting, checkpoint_sink=Sink()):
        if event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED:
            assert event.payload is not None
            assert event.payload["resumed"] is True
            assert event.payload["expires_at"] == first
            assert resumed.emit_external_event(answer("c9", True), config=CONFIG)


async def test_a_resumed_ask_whose_confirmation_expired_meanwhile_is_denied_at_once() -> None:
    waiting = await waiting_checkpoint(Sink())
    past = datetime.now(UTC) - timedelta(seconds=1)
    expired = RunCheckpoint.from_dict(
        {
            **waiting.to_dict(),
            "calls": [
                {
                    "call_id": "c9",
                    "name": "send_mail",
                    "state": "awaiting_approval",
                    "expires_at": past.isoformat(),
                }
            ],
        }
    )
    effects = Effects()
    events = [e async for e in ask_agent(effects, ["Not sent."]).resume(expired)]
    assert not [e for e in events if e.name == CONFIRMATION_REQUESTED]
    resolved = [e for e in events if e.name == CONFIRMATION_RESOLVED]
    assert [e.payload["outcome"] for e in resolved if e.payload] == ["expired"]
    assert effects.sent == []
    result = conversation(events)[-2]
    assert result["is_error"] is True
    assert "expired" in result["content"]


@pytest.mark.parametrize(("state", "sent"), [("approved", ["ada"]), ("denied", [])])
async def test_a_decided_call_is_not_asked_again(state: str, sent: list[str]) -> None:
    waiting = await waiting_checkpoint(Sink())
    decided = RunCheckpoint.from_dict(
        {**waiting.to_dict(), "calls": [{"call_id": "c9", "name": "send_mail", "state": state}]}
    )
    effects = Effects()
    events = [e async for e in ask_agent(effects, ["Done."]).resume(decided)]
    assert not [e for e in events if e.name == CONFIRMATION_REQUESTED]
    assert effects.sent == sent
    result = conversation(events)[-2]
    assert result["is_error"] is (state == "denied")


async def test_a_handed_over_run_leaves_no_stopped_turn() -> None:
    effects = Effects()
    core = ask_agent(effects, [tool_call_turn("send_mail", {"to": "ada"}, call_id="c9")])
    events: list[AgentEvent] = []
    # cancelled from outside the stream: it ends with run.cancelled, then says so
    with pytest.raises(RunCancelledError, match="handover"):
        async for event in core.stream("mail ada", config=CONFIG, checkpoint_sink=Sink()):
            events.append(event)
            if event.type is AgentEventType.CUSTOM and event.name == CONFIRMATION_REQUESTED:
                assert core.cancel_run("run_1", "handover")
    assert events[-1].type is AgentEventType.RUN_CANCELLED
    assert events[-1].reason == "handover"
    assert events[-1].messages == []


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"step": -1},
        {"added": "nope"},
        {"calls": [{"call_id": "zz", "name": "send_mail", "state": "pending"}]},
        {"calls": [{"call_id": "c9", "name": "send_mail", "state": "flying"}]},
        {
            "calls": [
                {
                    "call_id": "c9",
                    "name": "send_mail",
                    "state": "awaiting_approval",
                    "expires_at": "2026-01-01T00:00:00",
                }
            ]
        },
        {"run_id": 5},
    ],
)
async def test_a_bad_checkpoint_is_a_checkpoint_error(change: dict[str, Any]) -> None:
    waiting = await waiting_checkpoint(Sink())
    with pytest.raises(CheckpointError):
        RunCheckpoint.from_dict({**waiting.to_dict(), **change})
    with pytest.raises(CheckpointError):
        RunCheckpoint.from_dict("not a dict")  # type: ignore[arg-type]


def test_round_trip() -> None:
    checkpoint = RunCheckpoint(
        run_id="r",
        session_id="s",
        step=2,
        prompt="p",
        added=(
            *_prompt("p"),
            AssistantMessage("x", [ToolCall("c", "t", {"a": [1, 2]})]),
            ToolMessage("c", "t", "ok", approval="approved"),
        ),
        iteration=1,
        usage=_usage(),
        skill="review",
        structured_answers=1,
    )
    assert RunCheckpoint.from_dict(checkpoint.to_dict()) == checkpoint
