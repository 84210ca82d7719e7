"""Prompt caching: Anthropic's cache_control breakpoints, OpenAI's prompt_cache_key, the switch,
and what a cache that counts like the real ones makes of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_runtime import AgentCore, AgentEventType, AgentRunConfig, ModelBinding, presets, tool
from agent_runtime.messages import (
    AssistantMessage,
    Message,
    ReasoningState,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_runtime.model import ModelRequest, Usage
from agent_runtime.providers.anthropic import _messages
from agent_runtime.providers.anthropic_cache import MAX_BREAKPOINTS, mark_breakpoints
from agent_runtime.providers.media import MediaReader
from tests.fakes.upstream import FakeToolCall, FakeUpstream, Text, ToolCalls, freeze_imports

freeze_imports()

KEY = "sk-test-cache-0123456789abcdef"
MARK = {"type": "ephemeral"}
LONG_RULES = "Answer as a careful meteorologist would. " * 150  # over 1024 fake tokens


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server
        server.assert_consumed()


def llm(upstream: FakeUpstream, protocol: str, **params: Any) -> ModelBinding:
    url = upstream.anthropic_url if protocol == "anthropic" else upstream.openai_url
    return ModelBinding.llm(
        model="m-test",
        protocol=protocol,
        api_key=KEY,
        base_url=url,
        client_max_retries=0,
        params=params or None,
    )


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"rain in {city}"


def marked(body: dict[str, Any]) -> list[str]:
    """Where the request's breakpoints are, in request order."""
    found = [f"tool {t['name']}" for t in body.get("tools") or () if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += [f"system {i}" for i, b in enumerate(system) if "cache_control" in b]
    for turn, message in enumerate(body["messages"]):
        for index, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append(f"message {turn} block {index} {block['type']}")
    assert all(
        b.get("cache_control") == MARK
        for b in [*(body.get("tools") or ()), *(system if isinstance(system, list) else ())]
        if "cache_control" in b
    )
    return found


# Anthropic: where the breakpoints go --------------------------------------------------------------


async def test_anthropic_marks_tools_system_the_previous_end_and_the_end(
    upstream: FakeUpstream,
) -> None:
    upstream.script(
        ToolCalls([FakeToolCall("weather", {"city": "Oslo"}, id="toolu_1")]),
        Text("It rains."),
    )
    agent = AgentCore(llm(upstream, "anthropic"), tools=[weather], system_prompt="You help.")
    history = [SystemMessage("Summary of before.")]
    await agent.chat("Oslo?", conversation=history)
    await agent.aclose()

    first, second = (r.json for r in upstream.requests)
    assert first["system"] == [
        {"type": "text", "text": "You help.", "cache_control": MARK},
        {"type": "text", "text": "Summary of before."},  # below the agent's own instructions
    ]
    assert marked(first) == ["tool weather", "system 0", "message 0 block 0 text"]
    assert marked(second) == [
        "tool weather",
        "system 0",
        "message 0 block 0 text",  # where the first call ended: read back
        "message 2 block 0 tool_result",  # the end: written for the next call
    ]
    assert len(marked(second)) == MAX_BREAKPOINTS


async def test_prompt_caching_false_sends_no_breakpoint_and_no_switch(
    upstream: FakeUpstream,
) -> None:
    upstream.script(Text("ok"))
    async with AgentCore.open(
        llm(upstream, "anthropic"),
        system_prompt="You help.",
        model_params={"prompt_caching": False},
    ) as agent:
        await agent.chat("hi")
    body = upstream.requests[0].json
    assert body["system"] == "You help."
    assert marked(body) == []
    assert "prompt_caching" not in body


def test_breakpoints_keep_to_four_and_skip_what_cannot_be_marked() -> None:
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": MARK}]},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}]},
        {"role": "user", "content": [{"type": "text", "text": "next"}]},
        {"role": "assistant", "content": [thinking]},  # a prefill that is only thinking
    ]
    tools = [{"name": "a"}, {"name": "b"}]
    system = [{"type": "text", "text": "rules"}]
    mark_breakpoints(tools, system, turns)

    # the last turn has nothing markable; the one mark already there counts against the four
    assert "cache_control" not in turns[3]["content"][0]
    assert "cache_control" in system[0]
    assert "cache_control" in turns[2]["content"][0]  # the previous call's end
    assert "cache_control" in tools[1] and "cache_control" not in tools[0]
    assert thinking == {"type": "thinking", "thinking": "hm", "signature": "s"}  # not changed
    count = sum("cache_control" in b for t in turns for b in t["content"])
    assert count + 2 == MAX_BREAKPOINTS


def test_no_mark_left_means_no_mark_added() -> None:
    full = [{"type": "text", "text": str(i), "cache_control": MARK} for i in range(4)]
    turns: list[dict[str, Any]] = [{"role": "user", "content": full}]
    tools = [{"name": "a"}]
    mark_breakpoints(tools, [], turns)
    assert tools == [{"name": "a"}]


async def test_a_fake_cache_reads_back_what_the_breakpoints_wrote() -> None:
    async with FakeUpstream(prompt_cache=True) as upstream:
        upstream.script(
            ToolCalls([FakeToolCall("weather", {"city": "Oslo"}, id="toolu_1")]),
            Text("It rains."),
            Text("Still raining."),
        )
        agent = AgentCore(llm(upstream, "anthropic"), tools=[weather], system_prompt=LONG_RULES)
        first = await calls_usage(agent, "Oslo?", [])
        messages = [*first.messages]
        second = await calls_usage(agent, "And now?", messages)
        await agent.aclose()
        upstream.assert_consumed()

    (one, two), (three,) = first.usages, second.usages
    assert one.cached_input_tokens == 0
    assert one.cache_write_tokens is not None and one.cache_write_tokens > 1024
    # the tool loop's second call reads all the first call wrote, and writes its own growth
    assert two.cached_input_tokens == one.cache_write_tokens
    assert two.cache_write_tokens is not None and two.cache_write_tokens > 0
    # the session's next run reads the whole earlier tool loop back
    assert three.cached_input_tokens == one.cache_write_tokens + two.cache_write_tokens
    for usage in (one, two, three):
        assert usage.input_tokens >= (usage.cached_input_tokens or 0) + (
            usage.cache_write_tokens or 0
        )


class _Run:
    def __init__(self) -> None:
        self.usages: list[Usage] = []
        self.messages: list[Message] = []


async def calls_usage(agent: AgentCore, prompt: str, history: list[Message]) -> _Run:
    """Each model call's usage, and the conversation after the run."""
    run = _Run()
    async for event in agent.stream(prompt, conversation=history):
        if event.type is AgentEventType.USAGE and event.usage is not None:
            run.usages.append(event.usage)
        if event.type is AgentEventType.RUN_COMPLETED:
            run.messages = [*history, *(event.messages or [])]
    return run


# OpenAI: the session's cache key ---------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["openai", "openai-responses"])
async def test_prompt_cache_key_is_stable_per_session_and_never_the_raw_id(
    upstream: FakeUpstream, protocol: str
) -> None:
    upstream.script(
        ToolCalls([FakeToolCall("weather", {"city": "Oslo"})]),
        Text("a"),
        Text("b"),
        Text("c"),
    )
    agent = AgentCore(llm(upstream, protocol), tools=[weather], name="forecaster")
    await agent.chat("Oslo?", config=AgentRunConfig(session_id="session-one"))
    await agent.chat("again", config=AgentRunConfig(session_id="session-one"))
    await agent.chat("other", config=AgentRunConfig(session_id="session-two"))
    await agent.aclose()

    keys = [r.json["prompt_cache_key"] for r in upstream.requests]
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert all("session" not in key and len(key) == 32 for key in keys)
    other_agent = AgentCore(llm(upstream, protocol), name="another")
    upstream.script(Text("d"))
    await other_agent.chat("hi", config=AgentRunConfig(session_id="session-one"))
    await other_agent.aclose()
    assert upstream.requests[-1].json["prompt_cache_key"] != keys[0]


async def test_no_cache_key_when_switched_off_or_for_another_host(upstream: FakeUpstream) -> None:
    upstream.script(Text("a"), Text("b"))
    off = AgentCore(llm(upstream, "openai", prompt_caching=False))
    await off.chat("hi", config=AgentRunConfig(session_id="s1"))
    await off.aclose()
    # a preset host of the Chat Completions wire may refuse a parameter it does not know
    groq = presets.groq(base_url=upstream.openai_url, api_key=KEY, client_max_retries=0)
    other = AgentCore(groq)
    await other.chat("hi", config=AgentRunConfig(session_id="s1"))
    await other.aclose()
    for request in upstream.requests:
        assert "prompt_cache_key" not in request.json
        assert "prompt_caching" not in request.json


async def test_a_fake_openai_cache_counts_the_shared_prefix_per_key() -> None:
    async with FakeUpstream(prompt_cache=True) as upstream:
        upstream.script(Text("a"), Text("b"), Text("c"))
        agent = AgentCore(llm(upstream, "openai-responses"), system_prompt=LONG_RULES)
        one = await agent.chat("first", config=AgentRunConfig(session_id="s1"))
        again = await agent.chat(
            "second", config=AgentRunConfig(session_id="s1"), conversation=one.messages
        )
        elsewhere = await agent.chat("first", config=AgentRunConfig(session_id="s2"))
        await agent.aclose()

    assert one.usage.cached_input_tokens == 0
    assert again.usage.cached_input_tokens and again.usage.cached_input_tokens > 1024
    assert again.usage.input_tokens > again.usage.cached_input_tokens
    assert elsewhere.usage.cached_input_tokens == 0  # another key, another cache


async def test_the_conversation_with_reasoning_state_is_byte_stable() -> None:
    """The same history gives the same request prefix call after call (no per-call change)."""
    state = ReasoningState("anthropic", ({"type": "thinking", "thinking": "t", "signature": "s"},))
    history: list[Message] = [
        UserMessage("q"),
        AssistantMessage(
            "a", [ToolCall("t1", "weather", {})], reasoning="t", reasoning_state=state
        ),
        ToolMessage("t1", "weather", "rain"),
    ]
    reader = MediaReader(ModelRequest(messages=history), "claude", "anthropic")
    first = await _messages("rules", history, reader)
    second = await _messages("rules", history, reader)
    assert first == second
    first[1][1]["content"][0]["signature"] = "changed"
    assert state.blocks[0]["signature"] == "s"  # a request never shares the state's blocks
