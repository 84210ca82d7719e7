"""Side-effecting tools for the durable-run tests (``tests/scale/test_durable_runs.py``).

Each call appends a line (the worker, from ``DURABLE_WORKER``, and the tool) to the file
``DURABLE_EFFECTS`` names, before anything else, so that the test counts how many times a
call ran; then it waits ``DURABLE_TOOL_SECONDS`` (default 0) before it returns: long enough
on the worker the test kills for the kill to land while the call runs.
"""

from __future__ import annotations

import os
import time

from agent_runtime.tools.base import tool

__all__ = ["idempotent_effect", "once_effect"]


def _effect(name: str, text: str) -> str:
    with open(os.environ["DURABLE_EFFECTS"], "a", encoding="utf-8") as effects:
        effects.write(f"{os.environ.get('DURABLE_WORKER', '?')} {name} {text}\n")
    time.sleep(float(os.environ.get("DURABLE_TOOL_SECONDS", "0")))  # in the tool's thread
    return f"recorded {text}"


@tool
def once_effect(text: str) -> str:
    """Record a line (not safe to run twice)."""
    return _effect("once_effect", text)


@tool
def idempotent_effect(text: str) -> str:
    """Record a line (declared idempotent in the agent's configuration)."""
    return _effect("idempotent_effect", text)
