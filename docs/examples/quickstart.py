"""The README's first example: a scripted model calls a tool, the answer streams."""

import asyncio

from agent_runtime import AgentCore, AgentEventType, tool
from agent_runtime.testing import ScriptedModel, tool_call_turn


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    model = ScriptedModel([tool_call_turn("add", {"a": 2, "b": 3}), "It is 5."])
    async with AgentCore.open(model, tools=[add], run_timeout=30) as agent:
        async for event in agent.stream("What is 2 + 3?"):
            if event.type is AgentEventType.TEXT_DELTA:
                print(event.delta, end="")
        print()


if __name__ == "__main__":
    asyncio.run(main())
