"""Every program under docs/examples runs and exits cleanly, as a reader would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "docs" / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip(), "an example should say what it did"


def test_cancellation_example_output() -> None:
    path = next(p for p in EXAMPLES if p.stem == "cancellation")
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "run cancelled, extension state released" in out
    assert "next run: Second time lucky" in out
