"""Many concurrent sessions on one agent and one extension: nothing is left behind."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from agent_runtime import (
    AgentCore,
    AgentEventType,
    AgentExtension,
    AgentRunConfig,
    AgentRunContext,
    AssistantMessage,
    ProviderError,
    RunCancelledError,
    ToolCall,
    tool,
)
from agent_runtime.extensions.base import ToolOutcome
from agent_runtime.extensions.events import ExtensionEvent, RunCancelledEvent
from agent_runtime.messages import ToolMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse
from agent_runtime.testing import FunctionModel


class Ledger(AgentExtension):
    """Request-local maps of every shape an extension might keep."""

    def __init__(self) -> None:
        self.runs: dict[AgentRunContext, str] = {}
        self.calls: dict[tuple[AgentRunContext, str], str] = {}
        self.outcomes: dict[str, int] = {"success": 0, "error": 0, "cancelled": 0}

    async def before_run(self, context: AgentRunContext) -> None:
        self.runs[context] = context.session_id

    async def before_tool(self, context: AgentRunContext, call: ToolCall) -> None:
        self.calls[(context, call.id)] = call.name

    async def after_tool(
        self, context: AgentRunContext, call: ToolCall, outcome: ToolOutcome
    ) -> None:
        self.calls.pop((context, call.id), None)

    def _forget(self, context: AgentRunContext) -> None:
        self.runs.pop(context, None)
        for key in [k for k in self.calls if k[0] is context]:
            self.calls.pop(key, None)

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        if isinstance(event, RunCancelledEvent):
            self.outcomes["cancelled"] += 1
            self._forget(context)

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self.outcomes["success"] += 1
        self._forget(context)

    async def on_error(self, context: AgentRunContext, error: Exception) -> None:
        self.outcomes["error"] += 1
        self._forget(context)


@tool
async def work(kind: str) -> str:
    """A tool that succeeds, fails, or blocks until the run is cancelled."""
    if kind == "tool_error":
        raise ValueError("tool failed")
    if kind == "block":
        await asyncio.Event().wait()
    await asyncio.sleep(0)
    return "worked"


def behaviour(request: ModelRequest) -> AsyncIterator[ModelEvent]:
    kind = request.session_id.split("-")[0] if request.session_id else "success"
    has_result = any(isinstance(m, ToolMessage) for m in request.messages)

    async def stream() -> AsyncIterator[ModelEvent]:
        await asyncio.sleep(0)
        if kind == "failure":
            raise ProviderError("upstream failed")
        yield ModelEvent.text(f"{kind} ")
        if not has_result:
            tool_kind = {"tool_error": "tool_error", "cancel": "block"}.get(kind, "ok")
            call = ToolCall(f"call-{request.session_id}", "work", {"kind": tool_kind})
            yield ModelEvent.completed(ModelResponse(AssistantMessage(None, [call])))
            return
        yield ModelEvent.completed(ModelResponse(AssistantMessage(f"{kind} done")))

    return stream()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_hundred_concurrent_sessions_leave_nothing_behind(seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    agent = AgentCore(FunctionModel(behaviour), tools=[work], extensions=[ledger])
    kinds = [
        rng.choice(["success", "tool_error", "failure", "cancel", "close"]) for _ in range(100)
    ]
    blocked: dict[str, asyncio.Event] = {}

    async def one(index: int, kind: str) -> str:
        session = f"{kind}-{index}"
        config = AgentRunConfig(session_id=session, run_id=f"run-{index}")
        stream = agent.stream("go", config=config)
        try:
            async for event in stream:
                if kind == "close" and event.type is AgentEventType.TEXT_DELTA:
                    await stream.aclose()  # type: ignore[attr-defined]
                    return "closed"
                if kind == "cancel" and event.type is AgentEventType.TOOL_CALL_STARTED:
                    blocked[session].set()
        except ProviderError:
            return "failed"
        except RunCancelledError:
            return "cancelled"
        return "completed"

    for index, kind in enumerate(kinds):
        if kind == "cancel":
            blocked[f"cancel-{index}"] = asyncio.Event()
    tasks = [asyncio.create_task(one(i, k)) for i, k in enumerate(kinds)]
    for index, kind in enumerate(kinds):
        if kind == "cancel":
            await blocked[f"cancel-{index}"].wait()
            assert agent.cancel_run(f"run-{index}", "cancel_requested")
    results = await asyncio.gather(*tasks)

    expected = {"success": "completed", "tool_error": "completed", "failure": "failed"}
    expected.update({"cancel": "cancelled", "close": "closed"})
    assert results == [expected[k] for k in kinds]
    assert not agent.active_runs and not agent.active_sessions
    assert not ledger.runs and not ledger.calls
    assert ledger.outcomes == {
        "success": kinds.count("success") + kinds.count("tool_error"),
        "error": kinds.count("failure"),
        "cancelled": kinds.count("cancel") + kinds.count("close"),
    }
    # no run task of the agent is still alive
    current = asyncio.current_task()
    leftovers = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not [t for t in leftovers if "_execute" in repr(t.get_coro())]
