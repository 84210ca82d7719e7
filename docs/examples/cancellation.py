"""Leave a stream early, watch the run end as cancelled, then reuse the same agent.

Run it with ``uv run python docs/examples/cancellation.py``. Offline: the model is scripted.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from agent_runtime import AgentCore, AgentEventType, AgentExtension, AgentPhase, AgentRunContext
from agent_runtime.extensions.events import ExtensionEvent, RunCancelledEvent
from agent_runtime.messages import AssistantMessage
from agent_runtime.testing import ScriptedModel


class OpenRuns(AgentExtension):
    """Remembers which runs are in flight and forgets them on every way a run can end."""

    def __init__(self) -> None:
        self.open: set[AgentRunContext] = set()

    async def before_run(self, context: AgentRunContext) -> None:
        self.open.add(context)

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        self.open.discard(context)

    async def on_error(self, context: AgentRunContext, error: Exception) -> None:
        self.open.discard(context)

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        # cancellation is not an error: it arrives here, never in on_error
        if isinstance(event, RunCancelledEvent):
            self.open.discard(context)


async def leave_early(agent: AgentCore, runs: OpenRuns) -> None:
    # aclosing() closes the generator when the block ends, even after a break
    async with aclosing(agent.stream("Tell me a story")) as events:  # type: ignore[type-var]
        async for event in events:
            if event.type is AgentEventType.TEXT_DELTA:
                print("first words:", event.delta)
                break
    assert agent.state.phase is AgentPhase.CANCELLED
    assert not runs.open
    print("stream closed: run cancelled, extension state released")


async def main() -> None:
    runs = OpenRuns()
    model = ScriptedModel(["A long answer we will not wait for", "Second time lucky"])
    async with AgentCore.open(model, extensions=[runs]) as agent:
        await leave_early(agent, runs)
        again = await agent.chat("Try again")
        assert agent.state.phase is AgentPhase.COMPLETED and not runs.open
        print("next run:", again.content)
    model.assert_consumed()


if __name__ == "__main__":
    asyncio.run(main())
