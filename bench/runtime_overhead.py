"""The runtime's own cost per event: AgentCore.stream against iterating the model directly.

    uv run python -m bench.runtime_overhead [--deltas 20000] [--repeat 7]

The model yields pre-built text deltas without suspending, so the figure is the runtime's work
per event: building the AgentEvent, the channel hand-off between the run's task and the stream,
and the async generator step. Target: at most 10 µs added per event.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import AsyncIterator

from agent_runtime import AgentCore
from agent_runtime.messages import AssistantMessage
from agent_runtime.model import ModelEvent, ModelRequest, ModelResponse, RetryOptions


class FloodModel:
    """Yields ``n`` text deltas and a completed event, never suspending."""

    retry = RetryOptions(max_retries=0)
    model_name = "flood"

    def __init__(self, n: int) -> None:
        self.events = [ModelEvent.text("w ") for _ in range(n)]
        self.done = ModelEvent.completed(ModelResponse(AssistantMessage("w " * n)))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        for event in self.events:
            yield event
        yield self.done


async def direct(model: FloodModel) -> int:
    count = 0
    async for _ in model.stream(ModelRequest(messages=[])):
        count += 1
    return count


async def through_agent(agent: AgentCore) -> int:
    count = 0
    async for _ in agent.stream("go"):
        count += 1
    return count


async def measure(deltas: int, repeat: int) -> dict[str, float]:
    model = FloodModel(deltas)
    agent = AgentCore(model)
    await through_agent(agent)  # warm up
    await direct(model)
    base: list[float] = []
    runtime: list[float] = []
    gc.collect()
    for _ in range(repeat):
        start = time.perf_counter()
        await direct(model)
        base.append(time.perf_counter() - start)
        start = time.perf_counter()
        await through_agent(agent)
        runtime.append(time.perf_counter() - start)
    await agent.aclose()
    base_s = statistics.median(base)
    runtime_s = statistics.median(runtime)
    return {
        "deltas": deltas,
        "direct_events_per_s": deltas / base_s,
        "agent_events_per_s": deltas / runtime_s,
        "added_us_per_event": (runtime_s - base_s) / deltas * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    result = asyncio.run(measure(args.deltas, args.repeat))
    print(f"{'deltas':<28}{result['deltas']:>14,.0f}")
    print(f"{'model directly (events/s)':<28}{result['direct_events_per_s']:>14,.0f}")
    print(f"{'AgentCore.stream (events/s)':<28}{result['agent_events_per_s']:>14,.0f}")
    print(f"{'added per event (µs)':<28}{result['added_us_per_event']:>14.2f}")


if __name__ == "__main__":
    main()
