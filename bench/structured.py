"""11. Structured output against a catastrophic pattern: the event loop's worst stall.

A ``response_format`` of ``{"type": "string", "pattern": "^(a+)+$"}`` and an answer of n ``a``
and a ``!``. Each answer is checked the way a run checks it (``OutputSpec.acheck``: RE2, on the
validation threads) while a probe on the loop wakes every millisecond; the figure is the probe's
worst delay. The baseline, in the same process, is the plain ``jsonschema`` validator in a
thread (Python's backtracking ``re``, which holds the GIL): it doubles with each ``a``, so it is
measured up to ``BASELINE_MAX`` and extrapolated beyond.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema

from agent_runtime.structured import output_spec
from bench.outcome import Config, Outcome, Target

__all__ = ["scenario_structured"]

SCHEMA = {"type": "string", "pattern": "^(a+)+$"}
BASELINE_MAX = 24


def _answer(n: int) -> str:
    return json.dumps("a" * n + "!")


async def _stall(check: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """The loop's worst delay while ``check`` runs, and how long it took (seconds)."""
    worst = 0.0
    done = False

    async def probe() -> None:
        nonlocal worst
        while not done:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - started - 0.001)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await check()
    took = time.perf_counter() - started
    done = True
    await task
    return worst, took


async def _measure(quick: bool) -> dict[str, Any]:
    spec = output_spec(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    assert spec is not None
    plain = jsonschema.Draft202012Validator(SCHEMA)
    await spec.acheck('"a"')  # the validation threads start on first use, once a process
    new: dict[int, tuple[float, float]] = {}
    for n in range(27, 33):
        text = _answer(n)
        new[n] = await _stall(functools.partial(spec.acheck, text))
    old: dict[int, tuple[float, float]] = {}
    for n in range(BASELINE_MAX - (2 if quick else 3), BASELINE_MAX + (0 if quick else 1)):
        value = "a" * n + "!"
        old[n] = await _stall(functools.partial(asyncio.to_thread, plain.is_valid, value))
    return {"new": new, "old": old}


def scenario_structured(cfg: Config) -> Outcome:
    raw = asyncio.run(_measure(cfg.quick))
    new: dict[int, tuple[float, float]] = raw["new"]
    old: dict[int, tuple[float, float]] = raw["old"]
    last = max(old)
    first = min(old)
    # each further "a" about doubles the backtracking: the growth over the measured range
    growth = (old[last][1] / old[first][1]) ** (1 / (last - first)) if old[first][1] else 2.0
    out = Outcome(
        11,
        "Structured output: loop stall validating '^(a+)+$' against n a's and a '!'",
        columns=["n", "new: worst loop stall ms", "new: check ms", "old (jsonschema): stall s"],
    )
    for n in sorted(old):
        out.rows.append([n, "", "", f"{old[n][0]:.2f} (measured)"])
    for n in sorted(new):
        stall, took = new[n]
        estimate = old[last][1] * growth ** (n - last)
        out.rows.append([n, f"{stall * 1000:.2f}", f"{took * 1000:.2f}", f"~{estimate:.0f} (est.)"])
    worst = max(stall for stall, _ in new.values())
    out.targets.append(Target("worst loop stall, new validator", worst * 1000, 5.0, unit="ms"))
    out.notes.append(
        f"old: Python's re holds the GIL for the whole match; growth x{growth:.2f} per 'a' "
        f"measured over {first}..{last}, extrapolated beyond"
    )
    out.raw = {
        "new": {str(n): list(v) for n, v in new.items()},
        "old": {str(n): list(v) for n, v in old.items()},
        "growth": growth,
    }
    return out
