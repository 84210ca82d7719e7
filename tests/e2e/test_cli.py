"""``agent-server``'s own refusals, as a real process started from its console script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .conftest import AGENT_SERVER


def test_several_workers_without_a_shared_bus_are_refused(tmp_path: Path) -> None:
    # each would keep its own runs and session locks: events 404 on the other worker, two
    # turns of one session accepted at once
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env["AGENT_DATABASE_URL"] = f"sqlite:///{tmp_path}/agent.db"
    done = subprocess.run(
        [str(AGENT_SERVER), "--port", "0", "--workers", "2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot start: --workers 2 needs a shared bus: set AGENT_REDIS_URL" in done.stderr
