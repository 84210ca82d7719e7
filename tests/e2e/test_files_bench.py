"""The upload benchmark works end to end at a tiny size (its figures are in
docs/benchmarks.md, from a full run of ``python -m bench.uploads``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_upload_benchmark_measures_every_case(tmp_path: Path) -> None:
    out = tmp_path / "uploads.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.uploads",
            "--sizes",
            "1",
            "--uploads",
            "1",
            "--rounds",
            "1",
            "--no-postgres",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    cases = {(row["server"], row["case"]) for row in rows}
    for server in ("floor", "sqlite"):
        for case in ("upload 1 MB", "upload 1 MB, same content", "download 1 MB"):
            assert (server, case) in cases
    assert all(row["mb_per_s"] > 0 for row in rows)
