"""``python -m bench`` refuses at once, naming the install, when its plots cannot be drawn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# matplotlib made unimportable, as in an environment without the bench group
WITHOUT_MATPLOTLIB = (
    "import sys\n"
    "sys.modules['matplotlib'] = None\n"
    "from bench.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("command", [["run", "--quick"], ["docs"]])
def test_without_matplotlib_plots_are_refused_before_any_measuring(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "uv run --group bench python -m bench" in done.stderr
    assert done.stdout == ""  # no scenario started
