"""Tools: schemas, validation, threads, timeouts, parallel calls, policies and permissions."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from agent_runtime import (
    AgentCore,
    AgentEventType,
    AgentRunContext,
    ConfigurationError,
    ToolCall,
    ToolErrorLimitError,
    ToolPolicy,
    current_tool_call_id,
    tool,
)
from agent_runtime.agent import PermissionCallback
from agent_runtime.messages import AssistantMessage, ToolMessage
from agent_runtime.testing import ScriptedModel, tool_call_turn


def calls(*items: tuple[str, str, dict[str, object]]) -> AssistantMessage:
    return AssistantMessage(None, [ToolCall(cid, name, dict(args)) for cid, name, args in items])


def tool_results(model: ScriptedModel, request_index: int = 1) -> list[ToolMessage]:
    return [m for m in model.requests[request_index].messages if isinstance(m, ToolMessage)]


def test_schema_and_description_come_from_the_function() -> None:
    @tool
    def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast") -> list[str]:
        """Search the index.

        Returns matching titles.
        """
        return []

    assert search.name == "search"
    assert search.description.startswith("Search the index.")
    params = search.parameters
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    assert params["properties"]["query"] == {"type": "string"}
    assert params["properties"]["limit"] == {"type": "integer", "default": 5}
    assert params["properties"]["mode"]["enum"] == ["fast", "deep"]
    assert params["additionalProperties"] is False


def test_tool_options_and_bad_definitions() -> None:
    @tool(name="rm", description="Remove a thing.", policy="ask", timeout=2)
    async def remove(path: str) -> str:
        return path

    assert (remove.name, remove.description, remove.policy, remove.timeout) == (
        "rm",
        "Remove a thing.",
        ToolPolicy.ASK,
        2,
    )
    assert remove.is_async

    def variadic(*args: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"\*args"):
        tool(variadic)
    with pytest.raises(ConfigurationError, match="may hold only"):
        tool(name="bad name!")(remove.function)


async def test_invalid_arguments_go_back_to_the_model_as_a_tool_error() -> None:
    ran: list[int] = []

    @tool
    def square(n: int) -> int:
        """Square a number."""
        ran.append(n)
        return n * n

    model = ScriptedModel([tool_call_turn("square", {"n": "not a number"}), "sorry"])
    events = [e async for e in AgentCore(model, tools=[square]).stream("x")]
    (result,) = tool_results(model)
    assert result.is_error and "invalid arguments for square" in result.content
    assert "n:" in result.content
    assert not ran
    done = next(e for e in events if e.type is AgentEventType.TOOL_CALL_COMPLETED)
    assert done.is_error and done.error and "invalid arguments" in done.error


async def test_sync_tools_run_in_a_thread_and_async_tools_on_the_loop() -> None:
    seen: dict[str, object] = {}
    loop_thread = threading.get_ident()

    @tool
    def sync_tool() -> str:
        """Runs in a worker thread."""
        seen["sync_thread"] = threading.get_ident()
        seen["sync_call"] = current_tool_call_id()
        return "s"

    @tool
    async def async_tool() -> str:
        """Runs on the loop."""
        seen["async_thread"] = threading.get_ident()
        seen["async_call"] = current_tool_call_id()
        return "a"

    model = ScriptedModel(
        [calls(("c-sync", "sync_tool", {}), ("c-async", "async_tool", {})), "done"]
    )
    await AgentCore(model, tools=[sync_tool, async_tool]).chat("x")
    assert seen["sync_thread"] != loop_thread
    assert seen["async_thread"] == loop_thread
    assert seen["sync_call"] == "c-sync" and seen["async_call"] == "c-async"
    assert current_tool_call_id() is None


async def test_tool_timeout_applies_to_async_tools() -> None:
    @tool
    async def forever() -> None:
        """Never returns."""
        await asyncio.Event().wait()

    model = ScriptedModel([tool_call_turn("forever"), "gave up"])
    await AgentCore(model, tools=[forever], tool_timeout=0.05).chat("x")
    (result,) = tool_results(model)
    assert result.is_error and "timed out after 0.05 s" in result.content


async def test_tool_timeout_includes_time_queued_for_a_thread() -> None:
    # one worker thread, held by a blocker: the second call times out while still queued
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    started = threading.Event()

    @tool
    def blocker() -> str:
        """Holds the only worker thread."""
        started.set()
        release.wait(5)
        return "released"

    @tool
    def quick() -> str:
        """Would be instant if it got a thread."""
        return "quick"

    pool = ThreadPoolExecutor(max_workers=1)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(pool)
    try:
        model = ScriptedModel([calls(("c1", "blocker", {}), ("c2", "quick", {})), "done"])
        agent = AgentCore(model, tools=[blocker, quick], parallel_tool_calls=True, tool_timeout=0.2)
        # parallel calls are submitted in call order: the blocker takes the only thread first
        response = await agent.chat("x")
        assert started.is_set()
        assert response.content == "done"
        blocked, queued = tool_results(model)
        assert blocked.is_error and "timed out" in blocked.content
        assert queued.is_error and "timed out" in queued.content
    finally:
        release.set()


async def test_parallel_calls_overlap_and_results_keep_call_order() -> None:
    both_started = asyncio.Barrier(2)

    @tool
    async def slow(tag: str) -> str:
        """Waits for its sibling, proving the calls overlap."""
        await both_started.wait()
        return tag

    model = ScriptedModel(
        [calls(("c1", "slow", {"tag": "first"}), ("c2", "slow", {"tag": "second"})), "done"]
    )
    agent = AgentCore(model, tools=[slow], parallel_tool_calls=True)
    await asyncio.wait_for(agent.chat("x"), 5)
    assert [r.content for r in tool_results(model)] == ["first", "second"]


async def test_registry_is_read_once_per_run() -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def pause() -> str:
        """Waits for the test."""
        entered.set()
        await release.wait()
        return "ok"

    @tool
    def late() -> str:
        """Registered while a run is in flight."""
        return "late"

    model = ScriptedModel([tool_call_turn("pause"), tool_call_turn("late"), "end", "next"])
    agent = AgentCore(model, tools=[pause])
    task = asyncio.create_task(agent.chat("x"))
    await entered.wait()
    agent.registry.register(late)
    release.set()
    await task
    (result,) = tool_results(model, 2)[-1:]
    assert result.is_error and "unknown tool 'late'" in result.content
    await agent.chat("y")
    assert [t.name for t in model.requests[3].tools] == ["pause", "late"]


async def test_a_tool_not_advertised_cannot_run() -> None:
    ran: list[bool] = []

    @tool
    def hidden() -> str:
        """Filtered out of this run."""
        ran.append(True)
        return "ran"

    model = ScriptedModel([tool_call_turn("hidden"), "ok"])
    agent = AgentCore(model, tools=[hidden])
    await agent.chat("x", tool_filter=lambda t: t.name != "hidden")
    assert model.requests[0].tools == []
    (result,) = tool_results(model)
    assert result.is_error and not ran


async def test_a_tool_gate_has_the_last_word_right_before_a_call_starts() -> None:
    ran: list[str] = []

    @tool
    def write(text: str) -> str:
        """Write."""
        ran.append(text)
        return "written"

    asked: list[str] = []

    def gate(call: ToolCall) -> str | None:
        asked.append(call.id)
        return "not run: fenced" if call.arguments["text"] == "no" else None

    model = ScriptedModel(
        [calls(("c1", "write", {"text": "yes"}), ("c2", "write", {"text": "no"})), "ok"]
    )
    agent = AgentCore(model, tools=[write])
    await agent.chat("x", tool_gate=gate)
    first, second = tool_results(model)
    assert not first.is_error and first.content == "written"
    assert second.is_error and "not run: fenced" in second.content
    assert ran == ["yes"] and asked == ["c1", "c2"]


async def test_policies_allow_deny_and_glob_patterns() -> None:
    @tool
    def read_file() -> str:
        """Read."""
        return "content"

    @tool
    def delete_file() -> str:
        """Delete."""
        return "deleted"

    model = ScriptedModel([calls(("c1", "read_file", {}), ("c2", "delete_file", {})), "done"])
    agent = AgentCore(model, tools=[read_file, delete_file], tool_policies={"delete_*": "deny"})
    await agent.chat("x")
    read, deleted = tool_results(model)
    assert not read.is_error and read.content == "content"
    assert deleted.is_error and "not allowed by policy" in deleted.content


@pytest.mark.parametrize("verdict", ["sync-yes", "async-yes", "no", "raises", "missing"])
async def test_ask_policy_consults_the_permission_callback(verdict: str) -> None:
    ran: list[bool] = []
    seen: list[tuple[AgentRunContext, ToolCall]] = []

    @tool(policy="ask")
    def launch() -> str:
        """Needs approval."""
        ran.append(True)
        return "launched"

    def sync_yes(context: AgentRunContext, call: ToolCall) -> bool:
        seen.append((context, call))
        return True

    async def async_yes(context: AgentRunContext, call: ToolCall) -> bool:
        seen.append((context, call))
        return True

    def no(context: AgentRunContext, call: ToolCall) -> bool:
        return False

    def raises(context: AgentRunContext, call: ToolCall) -> bool:
        raise RuntimeError("approver down")

    callbacks: dict[str, PermissionCallback] = {
        "sync-yes": sync_yes,
        "async-yes": async_yes,
        "no": no,
        "raises": raises,
    }
    model = ScriptedModel([tool_call_turn("launch"), "ok"])
    agent = AgentCore(model, tools=[launch], permission_callback=callbacks.get(verdict))
    await agent.chat("x")
    (result,) = tool_results(model)
    if verdict.endswith("yes"):
        assert ran and not result.is_error
        assert seen[0][1].name == "launch"
    else:
        assert not ran and result.is_error and "denied" in result.content


async def test_five_consecutive_tool_errors_end_the_run() -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise ValueError("nope")

    turns = [tool_call_turn("broken", call_id=f"c{i}") for i in range(5)]
    model = ScriptedModel(turns)
    with pytest.raises(ToolErrorLimitError) as info:
        await AgentCore(model, tools=[broken]).chat("x")
    assert info.value.code == "tool_error_limit"
    model.assert_consumed()


async def test_a_success_resets_the_error_streak() -> None:
    @tool
    def flaky(ok: bool) -> str:
        """Fails unless ok."""
        if not ok:
            raise ValueError("nope")
        return "fine"

    turns = [tool_call_turn("flaky", {"ok": i == 3}, call_id=f"c{i}") for i in range(8)]
    model = ScriptedModel([*turns, "done"])
    assert (await AgentCore(model, tools=[flaky]).chat("x")).content == "done"
