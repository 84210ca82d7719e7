"""A side-effecting tool for the fencing test (``test_fencing_netns``): each call appends a line
to the file ``FENCING_EFFECTS`` names, with the worker (``FENCING_WORKER``) and the time, so that
a call made by a worker that lost the run's lease is visible after the fact."""

from __future__ import annotations

import os
import time

from agent_runtime.tools.base import tool


@tool(policy="ask")
def append_line(text: str) -> str:
    """Append a line to the effects file (needs approval)."""
    line = f"{os.environ.get('FENCING_WORKER', '?')} {time.time():.3f} {text}\n"
    with open(os.environ["FENCING_EFFECTS"], "a", encoding="utf-8") as effects:
        effects.write(line)
    return f"appended {text!r}"
