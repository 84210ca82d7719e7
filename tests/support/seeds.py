"""Load the complete examples of the specification documents, renamed to this package.

The documents live beside the checkout (``../shared/seeds``). Their examples must run with only
the package renamed, so the tests execute the documents' own text instead of a copy of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# beside the checkout; SEEDS_DIR names them for a checkout elsewhere (a worktree)
SEEDS = Path(
    os.environ.get("SEEDS_DIR") or Path(__file__).resolve().parents[3] / "shared" / "seeds"
)


def seed_text(prefix: str) -> str | None:
    """The text of the seed whose file name starts with ``prefix``, or None if absent."""
    if not SEEDS.is_dir():
        return None
    for path in sorted(SEEDS.glob(f"{prefix}_*.txt")):
        return path.read_text(encoding="utf-8")
    return None


def renamed(source: str) -> str:
    """Rename the documents' package names and the ``Agent`` class to this project's."""
    source = source.replace("zett_agent", "agent_runtime").replace("cliver_core", "agent_runtime")
    return re.sub(r"\bAgent\b(?=[.(,\s])", "AgentCore", source)


def complete_source(text: str, first_line: str, last_line: str) -> str:
    """The block of ``text`` from the line starting with ``first_line`` to ``last_line``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_line))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == last_line)
    return "\n".join(lines[start : end + 1]) + "\n"
