"""Context compaction: the LLM summary, the history bound, and their place in the run loop."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_runtime import (
    AgentCore,
    AgentRunConfig,
    ConfigurationError,
    InMemoryConversationStore,
    ModelBinding,
    ProviderError,
    ToolCall,
    tool,
)
from agent_runtime.compaction import (
    DEFAULT_MAX_HISTORY_MESSAGES,
    SUMMARY_PREFIX,
    ContextCompactor,
    LlmCompactor,
    prepare_context,
    trim_history,
    trim_step,
)
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn


def turn(index: int, tools: int = 0) -> list[Message]:
    """One exchange: a question, optionally one step calling ``tools`` tools, an answer."""
    messages: list[Message] = [UserMessage(f"question {index}")]
    if tools:
        ids = [f"c{index}_{k}" for k in range(tools)]
        messages.append(AssistantMessage(None, [ToolCall(i, "lookup", {"k": i}) for i in ids]))
        messages.extend(ToolMessage(i, "lookup", f"result {i}") for i in ids)
    messages.append(AssistantMessage(f"answer {index}"))
    return messages


def conversation(*sizes: int) -> list[Message]:
    """Turns with the given numbers of tool calls (0 for a plain question and answer)."""
    return [m for index, tools in enumerate(sizes) for m in turn(index, tools)]


def assert_whole(messages: Sequence[Message]) -> None:
    """Every tool result follows its call, and every call is followed by all its results."""
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            following: set[str] = set()
            for later in messages[index + 1 :]:
                if not isinstance(later, ToolMessage):
                    break
                following.add(later.tool_call_id)
            assert following == {c.id for c in message.tool_calls}, messages
        if isinstance(message, ToolMessage):
            back = index - 1
            while back >= 0 and isinstance(messages[back], ToolMessage):
                back -= 1
            owner = messages[back] if back >= 0 else None
            assert isinstance(owner, AssistantMessage), messages
            assert message.tool_call_id in {c.id for c in owner.tool_calls}, messages


def summarizer(text: str = "the summary") -> FunctionModel:
    return FunctionModel(lambda request: text)


# LlmCompactor -----------------------------------------------------------------------------------


async def test_below_the_trigger_nothing_is_summarised() -> None:
    model = ScriptedModel([])
    compactor = LlmCompactor(model, keep_last=2, trigger_messages=10)
    history = conversation(0, 0, 0)
    assert await compactor.compact(history, run_id="r") == history
    model.assert_consumed()
    assert isinstance(compactor, ContextCompactor)


async def test_the_summary_replaces_the_older_messages() -> None:
    model = ScriptedModel(["They talked about questions 0 to 6."])
    compactor = LlmCompactor(model, keep_last=4, trigger_messages=20)
    history: list[Message] = [SystemMessage("Be brief."), *conversation(0, 0, 1, 0, 0, 0, 0, 0, 0)]
    compacted = await compactor.compact(history, run_id="run_1")
    model.assert_consumed()
    assert compacted[0] == SystemMessage("Be brief.")  # instructions stay as they are
    assert compacted[1] == UserMessage(SUMMARY_PREFIX + "They talked about questions 0 to 6.")
    assert compacted[2:] == history[-4:]
    (request,) = model.requests
    assert request.run_id == "run_1"
    assert request.system == compactor.instructions
    assert request.tools == []
    (transcript,) = request.messages
    assert isinstance(transcript, UserMessage)
    assert "User: question 0" in transcript.content
    assert 'Assistant called tool lookup with {"k": "c2_0"}' in transcript.content
    assert "Tool lookup returned: result c2_0" in transcript.content
    assert "Be brief." not in transcript.content
    assert "question 8" not in transcript.content  # kept verbatim, so not summarised


@pytest.mark.parametrize("keep_last", range(1, 16))
async def test_a_tool_exchange_is_never_split(keep_last: int) -> None:
    compactor = LlmCompactor(summarizer(), keep_last=keep_last, trigger_messages=16)
    history = conversation(2, 0, 3, 1, 0)  # 6 + 2 + 7 + 4 + 2 = 21 messages
    compacted = await compactor.compact(history, run_id="r")
    assert_whole(compacted)
    assert compacted[-1] == history[-1]
    kept = compacted[1:]
    assert len(kept) >= keep_last
    assert kept == history[len(history) - len(kept) :]


async def test_summaries_roll_up_and_can_be_system_messages() -> None:
    compactor = LlmCompactor(
        summarizer("everything so far"), keep_last=2, trigger_messages=4, summary_role="system"
    )
    history: list[Message] = [SystemMessage(SUMMARY_PREFIX + "an earlier summary")]
    history += conversation(0, 0)
    compacted = await compactor.compact(history, run_id="r")
    assert compacted == [SystemMessage(SUMMARY_PREFIX + "everything so far"), *history[-2:]]
    model = compactor._model
    assert isinstance(model, FunctionModel)
    (transcript,) = model.requests[0].messages
    assert isinstance(transcript, UserMessage)
    assert "an earlier summary" in transcript.content


async def test_a_failed_summary_leaves_the_history_as_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = FunctionModel(lambda request: ProviderError("upstream down", retryable=True))
    compactor = LlmCompactor(failing, keep_last=2, trigger_messages=4)
    history = conversation(0, 0, 0)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.compaction"):
        assert await compactor.compact(history, run_id="r") == history
    assert "context compaction failed" in caplog.text
    assert "upstream down" not in caplog.text  # no model output or error text in logs


async def test_a_binding_can_make_the_summary() -> None:
    model = ScriptedModel(["short"])
    compactor = LlmCompactor(ModelBinding(provider=model), keep_last=1, trigger_messages=2)
    compacted = await compactor.compact(conversation(0, 0), run_id="r")
    assert compacted[0] == UserMessage(SUMMARY_PREFIX + "short")
    model.assert_consumed()


def test_bad_compactor_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="keep_last"):
        LlmCompactor(summarizer(), keep_last=0)
    with pytest.raises(ConfigurationError, match="trigger_messages"):
        LlmCompactor(summarizer(), keep_last=10, trigger_messages=10)
    with pytest.raises(ConfigurationError, match="not a model"):
        LlmCompactor(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_history_messages"):
        AgentCore(ScriptedModel([]), max_history_messages=0)
    with pytest.raises(ConfigurationError, match="max_history_messages"):
        trim_history(conversation(0), 0)


# the history bound ------------------------------------------------------------------------------


def test_the_bound_drops_the_oldest_whole_turns() -> None:
    history: list[Message] = [SystemMessage("rules"), *conversation(0, 2, 0, 1)]
    # turns: 2, 5, 2, 4 messages, plus the system message: 14
    assert trim_history(history, 14) == history
    trimmed = trim_history(history, 8)
    assert trimmed == [SystemMessage("rules"), *history[-6:]]
    assert trim_history(history, 12) == [SystemMessage("rules"), *history[-11:]]
    assert trim_history(history, 11) == trimmed  # turn 1 (5 messages) goes whole
    assert_whole(trimmed)


def test_a_long_last_turn_keeps_its_question_and_latest_step() -> None:
    long_turn: list[Message] = [UserMessage("do many things")]
    for step in range(5):
        long_turn.append(AssistantMessage(None, [ToolCall(f"s{step}", "work", {})]))
        long_turn.append(ToolMessage(f"s{step}", "work", "ok"))
    history = [*conversation(0), *long_turn]
    trimmed = trim_history(history, 5)
    assert trimmed == [long_turn[0], *long_turn[-4:]]
    # the question and the latest step always stay, even past the bound
    assert trim_history(history, 1) == [long_turn[0], *long_turn[-2:]]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=12),
    bound=st.integers(min_value=1, max_value=40),
)
def test_the_bound_never_orphans_a_tool_result(sizes: list[int], bound: int) -> None:
    history = conversation(*sizes)
    trimmed = trim_history(history, bound)
    assert_whole(trimmed)
    last_turn = turn(len(sizes) - 1, sizes[-1])
    # a suffix of whole units, or the last question followed by one
    tail = len(history) - len(trimmed)
    assert trimmed == history[tail:] or (
        trimmed[0] == last_turn[0] and trimmed[1:] == history[tail + 1 :]
    )
    assert len(trimmed) <= bound or trimmed == [last_turn[0], last_turn[-1]]


def test_the_bound_drops_in_steps_so_the_start_of_the_history_stays() -> None:
    assert trim_step(30) == 7
    kept = [trim_history(conversation(*[0] * turns), 30, step=8) for turns in (20, 21, 23, 24)]
    assert all(len(history) <= 30 for history in kept)
    # two messages a turn: 40, 42 and 46 messages are 10, 12 and 16 over, each rounded up to
    # 16 dropped, so the kept history starts at the same question; 48 (18 over) drops 24
    assert [history[0] for history in kept] == [
        UserMessage("question 8"),
        UserMessage("question 8"),
        UserMessage("question 8"),
        UserMessage("question 12"),
    ]
    # without a step the start moves with every message over the bound
    assert trim_history(conversation(*[0] * 21), 30)[0] == UserMessage("question 6")


async def test_the_run_bounds_its_history_in_steps() -> None:
    # 40 and 42 messages over a bound of 30: 10 and 12 over, both rounded up to the step of 7
    for turns in (20, 21):
        kept = await prepare_context(
            conversation(*[0] * turns), compactor=None, max_messages=30, run_id="r"
        )
        assert kept[0] == UserMessage("question 7")


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=12),
    bound=st.integers(min_value=1, max_value=40),
    step=st.integers(min_value=1, max_value=12),
)
def test_a_stepped_bound_keeps_whole_units_within_the_bound(
    sizes: list[int], bound: int, step: int
) -> None:
    history = conversation(*sizes)
    trimmed = trim_history(history, bound, step=step)
    assert_whole(trimmed)
    last_turn = turn(len(sizes) - 1, sizes[-1])
    assert len(trimmed) <= bound or trimmed == [last_turn[0], last_turn[-1]]
    tail = len(history) - len(trimmed)
    assert trimmed == history[tail:] or trimmed[0] == last_turn[0]


# in the run loop --------------------------------------------------------------------------------


class Recording:
    """A compactor that keeps the last ``keep`` messages and records its calls."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.calls: list[tuple[str, int]] = []

    async def compact(self, messages: list[Message], *, run_id: str) -> list[Message]:
        self.calls.append((run_id, len(messages)))
        return messages[-self.keep :]


@tool
def lookup(k: str) -> str:
    """Look something up."""
    return f"found {k}"


async def test_the_run_compacts_before_each_model_call() -> None:
    compactor = Recording(keep=3)
    model = ScriptedModel([tool_call_turn("lookup", {"k": "x"}), "done"])
    agent = AgentCore(model, tools=[lookup], context_compactor=compactor)
    history = conversation(0, 0, 0)
    response = await agent.chat("look it up", conversation=history)
    model.assert_consumed()
    assert compactor.calls == [(response.run_id, 7), (response.run_id, 5)]
    first, second = (request.messages for request in model.requests)
    assert first == [*history[-2:], UserMessage("look it up")]
    assert len(second) == 3 and isinstance(second[-1], ToolMessage)
    assert_whole(second)

    # a run may turn it off, or bring its own
    plain = ScriptedModel(["ok"])
    other = AgentCore(plain, context_compactor=compactor)
    await other.chat("hi", conversation=history, context_compactor=None)
    assert plain.requests[0].messages == [*history, UserMessage("hi")]
    assert len(compactor.calls) == 2


async def test_an_llm_compactor_summarises_once_and_the_store_keeps_everything() -> None:
    store = InMemoryConversationStore()
    history = conversation(0, 1, 0, 2, 0, 0)
    await store.append("s1", history)
    summary_model = ScriptedModel(["what happened before"])
    model = ScriptedModel([tool_call_turn("lookup", {"k": "y"}), "done"])
    agent = AgentCore(model, tools=[lookup], conversation_store=store)
    compactor = LlmCompactor(summary_model, keep_last=3, trigger_messages=10)
    await agent.chat("next", config=AgentRunConfig(session_id="s1"), context_compactor=compactor)
    summary_model.assert_consumed()  # one summary for the whole run
    model.assert_consumed()
    first, second = (request.messages for request in model.requests)
    assert first == [UserMessage(SUMMARY_PREFIX + "what happened before"), *first[1:]]
    assert first[1:] == [*history[-2:], UserMessage("next")]
    assert second[: len(first)] == first
    assert_whole(second)
    stored = await store.load("s1")
    assert stored[: len(history)] == history
    assert stored[len(history)] == UserMessage("next")
    assert all(
        not (isinstance(m, UserMessage) and m.text.startswith(SUMMARY_PREFIX)) for m in stored
    )


async def test_the_agent_bounds_the_history_it_sends() -> None:
    assert AgentCore(ScriptedModel([])).max_history_messages == DEFAULT_MAX_HISTORY_MESSAGES == 200
    model = ScriptedModel(["ok"])
    agent = AgentCore(model, max_history_messages=6)
    history = conversation(0, 2, 0, 0, 1)
    await agent.chat("latest", conversation=history)
    sent = model.requests[0].messages
    assert len(sent) <= 6
    assert isinstance(sent[0], UserMessage)
    assert sent[-1] == UserMessage("latest")
    assert_whole(sent)

    unbounded = ScriptedModel(["ok"])
    await AgentCore(unbounded, max_history_messages=None).chat("latest", conversation=history)
    assert len(unbounded.requests[0].messages) == len(history) + 1
