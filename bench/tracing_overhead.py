"""What tracing costs a run: short runs (a tool call, then a 20-delta answer) per second.

    uv run python -m bench.tracing_overhead [--runs 1000] [--rounds 5] [--base DIR]

Modes, measured in alternating rounds in separate processes (each a fresh interpreter):

- ``base``: the runtime of ``--base`` (a checkout of ``agent_runtime`` from before the tracing
  hooks, e.g. ``git archive <commit> agent_runtime | tar -x -C DIR``), no tracer;
- ``off``: this runtime, no tracer (the service without ``OTEL_*``);
- ``api``: ``OTelTracer`` on the API's default no-op provider (a library user without an SDK);
- ``sdk``: ``OTelTracer`` on an SDK provider whose batch processor hands spans to an exporter
  that drops them (the service with tracing on, minus the network).

Each round is a process's CPU time per run (not wall time: the machine is shared); the table
gives the fastest and the median round. ``off`` against ``base`` is the price of the hooks.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

MODES = ("base", "off", "api", "sdk")


def _build_agent(mode: str) -> Any:
    from agent_runtime import AgentCore, tool
    from agent_runtime.messages import AssistantMessage, ToolCall
    from agent_runtime.model import (
        ModelEvent,
        ModelRequest,
        ModelResponse,
        RetryOptions,
        Usage,
    )

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    call_turn = ModelEvent.completed(
        ModelResponse(AssistantMessage(None, [ToolCall("c1", "lookup", {"key": "k"})]), Usage(5, 1))
    )
    deltas = [ModelEvent.text("w ") for _ in range(20)]
    answer = ModelEvent.completed(ModelResponse(AssistantMessage("w " * 20), Usage(9, 20)))

    class Model:
        retry = RetryOptions(max_retries=0)
        model_name = "bench"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
            if len(request.messages) == 1:
                yield call_turn
                return
            for delta in deltas:
                yield delta
            yield answer

    options: dict[str, Any] = {}
    if mode in ("api", "sdk"):
        from agent_runtime.integrations.otel import OTelTracer

        provider = None
        if mode == "sdk":
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                BatchSpanProcessor,
                SpanExporter,
                SpanExportResult,
            )

            class Drop(SpanExporter):
                def export(self, spans: Sequence[Any]) -> SpanExportResult:
                    return SpanExportResult.SUCCESS

            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(Drop()))
        options["tracer"] = OTelTracer(tracer_provider=provider)
    return AgentCore(Model(), tools=[lookup], **options)


async def _measure(mode: str, runs: int) -> float:
    agent = _build_agent(mode)

    async def one() -> None:
        async for _ in agent.stream("go"):
            pass

    for _ in range(50):  # warm up
        await one()
    gc.collect()
    # CPU time of this process: the machine is shared, and another's load stretches wall time
    started = time.process_time()
    for _ in range(runs):
        await one()
    return (time.process_time() - started) / runs * 1e6


def _child(mode: str, runs: int) -> None:
    print(json.dumps({"mode": mode, "us_per_run": asyncio.run(_measure(mode, runs))}))


def _round(mode: str, runs: int, base: Path | None) -> float:
    env = dict(os.environ)
    if mode == "base":
        assert base is not None
        env["PYTHONPATH"] = str(base)
    measured = "off" if mode == "base" else mode
    out = subprocess.run(
        [sys.executable, "-m", "bench.tracing_overhead", "--child", measured, "--runs", str(runs)],
        env=env,
        cwd=Path(__file__).resolve().parents[1] if mode != "base" else base,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    value: float = json.loads(out.strip().splitlines()[-1])["us_per_run"]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", type=Path, default=None)
    parser.add_argument("--child", choices=("off", "api", "sdk"), default=None)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.runs)
        return
    modes = [m for m in MODES if m != "base" or args.base is not None]
    if args.base is not None:
        # the base's bench package is this one: the child imports only agent_runtime from it
        (args.base / "bench").mkdir(exist_ok=True)
        target = args.base / "bench" / "tracing_overhead.py"
        target.write_text(Path(__file__).read_text(encoding="utf-8"), encoding="utf-8")
        (args.base / "bench" / "__init__.py").touch()
    figures: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            figures[mode].append(_round(mode, args.runs, args.base))
    first = figures["base" if "base" in figures else "off"]
    best, middle = min(first), statistics.median(first)
    print(f"{'mode':<6}{'fastest µs/run':>16}{'ratio':>8}{'median µs/run':>16}{'ratio':>8}")
    for mode in modes:
        low, median = min(figures[mode]), statistics.median(figures[mode])
        print(f"{mode:<6}{low:>16.1f}{low / best:>8.3f}{median:>16.1f}{median / middle:>8.3f}")
    print("rounds:", {m: [round(v) for v in figures[m]] for m in modes})


if __name__ == "__main__":
    main()
