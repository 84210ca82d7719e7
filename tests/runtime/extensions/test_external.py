"""ExternalEvent and the ExternalEventExtension base: registration, matching, claiming, cleanup."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    AgentPhase,
    AgentRunConfig,
    AgentRunContext,
    RunError,
    ToolCall,
    tool,
)
from agent_runtime.extensions.events import ExtensionEvent, RunCancelledEvent
from agent_runtime.extensions.external import (
    ExternalEvent,
    ExternalEventExpiredError,
    ExternalEventExtension,
)
from agent_runtime.testing import ScriptedModel, tool_call_turn

# -- ExternalEvent ------------------------------------------------------------------------------


def test_external_event_holds_name_and_payload() -> None:
    event = ExternalEvent("answer", {"id": "x", "value": 1})
    assert event.name == "answer"
    assert event.payload == {"id": "x", "value": 1}


def test_external_event_copies_its_payload() -> None:
    payload: dict[str, Any] = {"id": "x"}
    event = ExternalEvent("answer", payload)
    payload["id"] = "changed"
    assert event.payload == {"id": "x"}


def test_external_event_is_frozen() -> None:
    event = ExternalEvent("answer", {})
    with pytest.raises(AttributeError):
        event.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "   ", "\n"])
def test_external_event_rejects_an_empty_name(name: str) -> None:
    with pytest.raises(ValueError, match="name must not be empty"):
        ExternalEvent(name, {})


def test_external_event_rejects_a_name_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="name must be a str, got int"):
        ExternalEvent(3, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", [None, [("a", 1)], "text", 5])
def test_external_event_rejects_a_payload_that_is_not_a_dict(payload: object) -> None:
    with pytest.raises(TypeError, match="payload must be a dict"):
        ExternalEvent("answer", payload)  # type: ignore[arg-type]


def test_external_event_rejects_non_string_keys() -> None:
    with pytest.raises(TypeError, match="keys must be strings; found 1"):
        ExternalEvent("answer", {"ok": True, 1: "no"})  # type: ignore[dict-item]


# -- a minimal subclass in the shape the base is meant for --------------------------------------


class Approval(ExternalEventExtension):
    """Waits for ``answer`` before the ``gated`` tool; the tool reads the staged answer."""

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__(response_event_name=("answer", "other_answer"), correlation_field="id")
        self.timeout = timeout
        self.read: list[Any] = []
        self.expired: list[str] = []
        self.body_hook: Any = None
        self.cancel_notices: list[str] = []

    async def on_tool(self, context: AgentRunContext) -> None:
        ext = self

        @tool
        async def gated() -> str:
            """A tool that needs an outside answer first."""
            answer = ext._take_external_event(context)
            ext.read.append(answer.payload.get("value"))
            return f"value={answer.payload.get('value')}"

        context.register_tool(gated)

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        if call.name != "gated":
            return
        try:
            async with self._wait_for_external_event(
                context, call.id, timeout=self.timeout
            ) as wait:
                if self.body_hook is not None:
                    self.body_hook(context, call)
                await context.emit(
                    AgentEvent(
                        AgentEventType.CUSTOM,
                        name="question",
                        payload={"id": call.id, "expires_at": wait.expires_at},
                    )
                )
        except ExternalEventExpiredError as exc:
            self.expired.append(exc.correlation_id)

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        if isinstance(event, RunCancelledEvent):
            self.cancel_notices.append(event.reason)
        await super().on_event(context, event)


def gated_agent(ext: Approval, *turns: Any, call_id: str = "c1", **kwargs: Any) -> AgentCore:
    script = turns or (tool_call_turn("gated", call_id=call_id), "finished")
    return AgentCore(ScriptedModel(script), extensions=[ext], **kwargs)


def answer(call_id: str, value: Any = 1, name: str = "answer") -> ExternalEvent:
    return ExternalEvent(name, {"id": call_id, "value": value})


def assert_clean(agent: AgentCore, ext: ExternalEventExtension) -> None:
    assert ext.pending_count() == 0
    assert ext.staged_count() == 0
    assert not agent.active_runs
    assert not agent.active_sessions


async def until_question(events: AsyncIterator[AgentEvent]) -> AgentEvent:
    async for event in events:
        if event.type is AgentEventType.CUSTOM and event.name == "question":
            return event
    raise AssertionError("the run ended without asking")


async def drain(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    return [event async for event in events]


# -- constructor checks -------------------------------------------------------------------------


@pytest.mark.parametrize("names", ["", " ", [], ["ok", ""], [3]])
def test_constructor_rejects_bad_event_names(names: Any) -> None:
    with pytest.raises(ValueError, match="response"):
        ExternalEventExtension(response_event_name=names, correlation_field="id")


def test_constructor_rejects_an_empty_correlation_field() -> None:
    with pytest.raises(ValueError, match="correlation_field"):
        ExternalEventExtension(response_event_name="answer", correlation_field=" ")


def test_constructor_accepts_one_name_or_several() -> None:
    one = ExternalEventExtension(response_event_name="a", correlation_field="id")
    many = ExternalEventExtension(response_event_name=["a", "b"], correlation_field="id")
    assert one.response_event_names == frozenset({"a"})
    assert many.response_event_names == frozenset({"a", "b"})
    assert many.correlation_field == "id"


# -- the happy path -----------------------------------------------------------------------------


async def test_answer_is_staged_and_taken_by_the_tool() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1", request_id="r1")
    events = agent.stream("go", config=config)
    question = await until_question(events)
    assert question.payload == {"id": "c1", "expires_at": None}
    assert agent.active_runs[question.run_id].phase is AgentPhase.WAITING
    assert ext.pending_count() == 1 and ext.pending_count("s1") == 1
    assert ext.pending_count("other") == 0
    assert ext.is_waiting("s1", "c1")
    assert agent.emit_external_event(answer("c1", 42), config=config) == ["Approval"]
    assert not ext.is_waiting("s1", "c1")
    rest = await drain(events)
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    done = [e for e in rest if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert done[0].result == "value=42"
    assert ext.read == [42]
    assert_clean(agent, ext)


async def test_an_answer_given_inside_the_body_is_not_lost() -> None:
    """The wait exists before the body runs, so an instant answer finds it."""
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    verdicts: list[list[str]] = []
    ext.body_hook = lambda context, call: verdicts.append(
        agent.emit_external_event(answer(call.id, "early"), config=config)
    )
    events = await drain(agent.stream("go", config=config))
    assert verdicts == [["Approval"]]
    assert ext.read == ["early"]
    assert events[-1].type is AgentEventType.RUN_COMPLETED
    assert_clean(agent, ext)


async def test_any_configured_name_is_accepted() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    assert agent.emit_external_event(answer("c1", name="unrelated"), config=config) == []
    assert agent.emit_external_event(answer("c1", name="other_answer"), config=config) == [
        "Approval"
    ]
    await drain(events)
    assert_clean(agent, ext)


async def test_answer_from_a_foreign_thread_wakes_the_loop() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    verdict: list[list[str]] = []
    thread = threading.Thread(
        target=lambda: verdict.append(agent.emit_external_event(answer("c1", 7), config=config))
    )
    thread.start()
    rest = await drain(events)  # only a wake-up from the thread can finish the run
    await asyncio.to_thread(thread.join)
    assert verdict == [["Approval"]]
    assert rest[-1].type is AgentEventType.RUN_COMPLETED
    assert ext.read == [7]
    assert_clean(agent, ext)


# -- what is refused ----------------------------------------------------------------------------


async def test_refusals_leave_the_wait_open() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1", request_id="r1")
    events = agent.stream("go", config=config)
    await until_question(events)
    refused = [
        (answer("c1"), None),  # no config: no session to route by
        (answer("c1"), AgentRunConfig()),  # no session id
        (answer("c2"), config),  # unknown correlation id
        (answer("c1"), AgentRunConfig(session_id="s2")),  # another session
        (answer("c1"), AgentRunConfig(session_id="s1", request_id="r2")),  # another request
        (ExternalEvent("answer", {"value": 1}), config),  # no correlation id
        (ExternalEvent("answer", {"id": 5}), config),  # correlation id is not a string
        (answer("c1", name="nope"), config),  # a name this extension does not take
    ]
    for event, cfg in refused:
        assert ext.accept(cfg, event) is False
    assert agent.emit_external_event(answer("c1")) == []  # the agent has no default config
    assert ext.is_waiting("s1", "c1")
    # a config without request_id matches any request of the session
    assert agent.emit_external_event(answer("c1", "ok"), config=AgentRunConfig("s1")) == [
        "Approval"
    ]
    await drain(events)
    assert ext.read == ["ok"]
    assert_clean(agent, ext)


async def test_duplicate_and_late_answers_are_refused() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    assert agent.emit_external_event(answer("c1", "first"), config=config) == ["Approval"]
    assert agent.emit_external_event(answer("c1", "second"), config=config) == []
    await drain(events)
    assert agent.emit_external_event(answer("c1", "late"), config=config) == []
    assert ext.read == ["first"]
    assert_clean(agent, ext)


async def test_sessions_with_the_same_correlation_id_do_not_share_answers() -> None:
    ext = Approval()
    turn = tool_call_turn("gated", call_id="same")
    model = ScriptedModel([turn, turn, "one", "two"])
    agent = AgentCore(model, extensions=[ext])
    a, b = AgentRunConfig(session_id="a"), AgentRunConfig(session_id="b")
    events_a = agent.stream("go", config=a)
    events_b = agent.stream("go", config=b)
    await until_question(events_a)
    await until_question(events_b)
    assert ext.pending_count() == 2
    assert agent.emit_external_event(answer("same", "for b"), config=b) == ["Approval"]
    await drain(events_b)
    assert ext.is_waiting("a", "same")  # b's answer did not touch a
    assert agent.emit_external_event(answer("same", "for b"), config=b) == []
    assert agent.emit_external_event(answer("same", "for a"), config=a) == ["Approval"]
    await drain(events_a)
    assert ext.read == ["for b", "for a"]
    assert_clean(agent, ext)


# -- the helper's own checks --------------------------------------------------------------------


async def test_helper_argument_checks() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    context = next(iter(agent.active_runs.values()))
    with pytest.raises(ValueError, match="correlation_id"):
        async with ext._wait_for_external_event(context, " "):
            pass
    with pytest.raises(ValueError, match="not one of"):
        async with ext._wait_for_external_event(context, "x", response_event_name="other"):
            pass
    with pytest.raises(ValueError, match="timeout"):
        async with ext._wait_for_external_event(context, "x", timeout=0):
            pass
    with pytest.raises(ValueError, match="timeout"):
        async with ext._wait_for_external_event(context, "x", timeout=float("nan")):
            pass
    with pytest.raises(RuntimeError, match="already waiting"):
        async with ext._wait_for_external_event(context, "c1"):
            pass
    assert ext.pending_count() == 1  # only the run's own wait
    assert agent.emit_external_event(answer("c1"), config=config) == ["Approval"]
    await drain(events)
    assert_clean(agent, ext)


async def test_response_event_name_narrows_a_single_wait() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    context = next(iter(agent.active_runs.values()))

    registered = asyncio.Event()

    async def side_wait() -> Any:
        async with ext._wait_for_external_event(
            context, "side", response_event_name="other_answer"
        ):
            registered.set()
        return ext._take_external_event(context, "side").payload["value"]

    waiter = asyncio.create_task(side_wait())
    await registered.wait()
    assert ext.is_waiting("s1", "side")
    assert agent.emit_external_event(answer("side", name="answer"), config=config) == []
    assert agent.emit_external_event(answer("side", 9, name="other_answer"), config=config) == [
        "Approval"
    ]
    assert await waiter == 9
    assert agent.emit_external_event(answer("c1"), config=config) == ["Approval"]
    await drain(events)
    assert_clean(agent, ext)


async def test_take_without_a_staged_answer_raises() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    context = next(iter(agent.active_runs.values()))
    with pytest.raises(RuntimeError, match="no tool call is executing"):
        ext._take_external_event(context)
    with pytest.raises(RuntimeError, match="no external answer is staged for 'c1'"):
        ext._take_external_event(context, "c1")
    assert agent.emit_external_event(answer("c1"), config=config) == ["Approval"]
    await drain(events)
    assert_clean(agent, ext)


async def test_an_answer_the_tool_never_takes_is_dropped() -> None:
    """The call was answered, but its arguments are invalid: the tool never runs."""
    ext = Approval()
    agent = gated_agent(ext, tool_call_turn("gated", {"bogus": 1}, call_id="c1"), "done")
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    assert agent.emit_external_event(answer("c1"), config=config) == ["Approval"]
    rest = await drain(events)
    done = [e for e in rest if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert done[0].is_error and ext.read == []
    assert_clean(agent, ext)


# -- expiry -------------------------------------------------------------------------------------


async def test_expired_wait_refuses_a_late_answer() -> None:
    ext = Approval(timeout=0.01)
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    question = await until_question(events)
    assert question.payload is not None and question.payload["expires_at"] is not None
    rest = await drain(events)  # the wait expires on its own; the tool finds no answer
    assert ext.expired == ["c1"]
    done = [e for e in rest if e.type is AgentEventType.TOOL_CALL_COMPLETED]
    assert done[0].is_error and "no external answer is staged" in (done[0].error or "")
    assert agent.emit_external_event(answer("c1"), config=config) == []
    assert_clean(agent, ext)


# -- terminal paths -----------------------------------------------------------------------------


async def test_cancellation_while_waiting_cleans_up() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    question = await until_question(events)
    assert agent.cancel_run(question.run_id)
    with pytest.raises(RunError, match="cancel_requested"):
        await drain(events)
    assert ext.cancel_notices == ["cancel_requested"]  # the subclass's override ran, then super
    assert agent.emit_external_event(answer("c1"), config=config) == []
    assert_clean(agent, ext)


async def test_closing_the_stream_while_waiting_cancels_and_cleans_up() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    await events.aclose()  # type: ignore[attr-defined]
    assert agent.state.phase is AgentPhase.CANCELLED
    assert ext.cancel_notices == ["consumer_closed"]
    assert_clean(agent, ext)


async def test_on_error_wakes_a_waiter_with_the_error() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    context = next(iter(agent.active_runs.values()))
    await ext.on_error(context, LookupError("storage went away"))
    with pytest.raises(LookupError, match="storage went away"):
        await drain(events)
    assert agent.state.phase is AgentPhase.FAILED
    assert agent.emit_external_event(answer("c1"), config=config) == []
    assert_clean(agent, ext)


async def test_on_error_wakes_a_wait_held_by_another_task() -> None:
    """A wait outside the run's own task (say, in a tool running in parallel) is woken too."""
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    context = next(iter(agent.active_runs.values()))

    registered = asyncio.Event()

    async def side_wait() -> None:
        async with ext._wait_for_external_event(context, "side"):
            registered.set()

    waiter = asyncio.create_task(side_wait())
    await registered.wait()
    await ext.on_error(context, LookupError("boom"))
    with pytest.raises(LookupError, match="boom"):
        await waiter
    with pytest.raises(LookupError, match="boom"):
        await drain(events)
    assert_clean(agent, ext)


async def test_run_timeout_while_waiting_fails_the_run_and_cleans_up() -> None:
    ext = Approval()
    agent = gated_agent(ext, run_timeout=0.05)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    with pytest.raises(RunError, match="run_timeout"):
        await drain(events)
    assert agent.emit_external_event(answer("c1"), config=config) == []
    assert_clean(agent, ext)


async def test_aclose_while_waiting_cancels_the_wait() -> None:
    ext = Approval()
    agent = gated_agent(ext)
    config = AgentRunConfig(session_id="s1")
    events = agent.stream("go", config=config)
    await until_question(events)
    consumer = asyncio.create_task(drain(events))
    await agent.aclose()
    with pytest.raises(RunError, match="shutdown"):
        await consumer
    assert ext.cancel_notices == ["shutdown"]
    assert_clean(agent, ext)


async def test_a_new_run_works_after_success_failure_and_cancellation() -> None:
    ext = Approval()
    model = ScriptedModel(
        [
            tool_call_turn("gated", call_id="c1"),
            "first done",
            tool_call_turn("gated", call_id="c1"),  # this run will be cancelled
            tool_call_turn("gated", call_id="c1"),  # this run will fail
            tool_call_turn("gated", call_id="c1"),
            "last done",
        ]
    )
    agent = AgentCore(model, extensions=[ext])
    config = AgentRunConfig(session_id="s1")

    async def answered_run(value: str) -> list[AgentEvent]:
        events = agent.stream("go", config=config)
        await until_question(events)
        assert agent.emit_external_event(answer("c1", value), config=config) == ["Approval"]
        return await drain(events)

    first = await answered_run("one")
    assert first[-1].type is AgentEventType.RUN_COMPLETED
    assert_clean(agent, ext)

    events = agent.stream("go", config=config)
    question = await until_question(events)
    agent.cancel_run(question.run_id)
    with pytest.raises(RunError):
        await drain(events)
    assert_clean(agent, ext)

    events = agent.stream("go", config=config)
    await until_question(events)
    await ext.on_error(next(iter(agent.active_runs.values())), LookupError("x"))
    with pytest.raises(LookupError):
        await drain(events)
    assert_clean(agent, ext)

    last = await answered_run("four")
    assert last[-1].type is AgentEventType.RUN_COMPLETED
    assert ext.read == ["one", "four"]
    model.assert_consumed()
    assert_clean(agent, ext)
