"""The built-in tools: the per-run Todo list (TodoWrite, TodoRead)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent_runtime import AgentCore, tool
from agent_runtime.messages import AssistantMessage, ToolMessage
from agent_runtime.model import ModelRequest
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn
from agent_runtime.tools import discover_builtin_tools, run_state
from agent_runtime.tools.builtin import MAX_TODOS


def results(messages: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(m.content) for m in messages if isinstance(m, ToolMessage)]


async def test_discover_returns_the_todo_tools() -> None:
    assert [t.name for t in discover_builtin_tools()] == ["TodoWrite", "TodoRead"]


async def test_write_then_read_within_one_run() -> None:
    todos = [{"content": "plan"}, {"content": "build", "status": "in_progress"}]
    model = ScriptedModel(
        [
            tool_call_turn("TodoRead"),
            tool_call_turn("TodoWrite", {"todos": todos}),
            tool_call_turn("TodoRead"),
            "done",
        ]
    )
    agent = AgentCore(model, builtin_tools=discover_builtin_tools())
    response = await agent.chat("work")
    empty, written, read = results(response.messages)
    assert empty == {"todos": [], "total": 0}
    assert written["total"] == 2 and written["completed"] == 0
    assert read["todos"] == [
        {"index": 1, "content": "plan", "status": "pending"},
        {"index": 2, "content": "build", "status": "in_progress"},
    ]
    await agent.aclose()


async def test_each_run_has_its_own_list_even_concurrently() -> None:
    count = 50
    gate = asyncio.Event()
    arrived = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal arrived
        run = int(str(request.messages[0].content).split()[-1])
        calls = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if calls == 0:
            return tool_call_turn("TodoRead", call_id=f"r{run}")
        if calls == 1:
            return tool_call_turn(
                "TodoWrite", {"todos": [{"content": f"task of run {run}"}]}, call_id=f"w{run}"
            )
        if calls == 2:
            # every run has written before any reads back: the lists exist side by side
            arrived += 1
            if arrived == count:
                gate.set()
            await gate.wait()
            return tool_call_turn("TodoRead", call_id=f"r2{run}")
        return "done"

    agent = AgentCore(FunctionModel(answer), builtin_tools=discover_builtin_tools())
    responses = await asyncio.wait_for(
        asyncio.gather(*(agent.chat(f"run {i}") for i in range(count))), 60
    )
    for i, response in enumerate(responses):
        first, _written, last = results(response.messages)
        assert first["total"] == 0  # a run starts with an empty list
        assert [t["content"] for t in last["todos"]] == [f"task of run {i}"]
    await agent.aclose()


async def test_a_bad_or_oversized_list_is_an_error_result() -> None:
    model = ScriptedModel(
        [
            tool_call_turn("TodoWrite", {"todos": [{"content": "x", "status": "maybe"}]}),
            tool_call_turn("TodoWrite", {"todos": [{"content": "x"}] * (MAX_TODOS + 1)}),
            "ok",
        ]
    )
    agent = AgentCore(model, builtin_tools=discover_builtin_tools())
    response = await agent.chat("x")
    errors = [m for m in response.messages if isinstance(m, ToolMessage)]
    assert all(m.is_error for m in errors)
    assert "status" in errors[0].content
    assert f"at most {MAX_TODOS}" in errors[1].content
    await agent.aclose()


async def test_run_state_is_only_for_tools_of_a_run() -> None:
    with pytest.raises(RuntimeError, match="only available inside a tool"):
        run_state()

    seen: list[int] = []

    @tool
    def counter() -> int:
        """A sync tool (run in a thread) sees its run's state too."""
        state = run_state()
        state["n"] = state.get("n", 0) + 1
        seen.append(state["n"])
        return int(state["n"])

    model = ScriptedModel(
        [tool_call_turn("counter"), tool_call_turn("counter"), "a", tool_call_turn("counter"), "b"]
    )
    agent = AgentCore(model, tools=[counter])
    await agent.chat("one")
    await agent.chat("two")
    assert seen == [1, 2, 1]
    await agent.aclose()
