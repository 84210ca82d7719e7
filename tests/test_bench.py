"""The benchmark harness works: every scenario runs end to end at a tiny size (``--quick``).

It asserts nothing about the figures (CI machines are noisy and small); the figures and their
targets are in docs/benchmarks.md, from a full run (``uv run python -m bench run``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]


def test_quick_run_exercises_every_scenario(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--quick", "--no-plots", "--results", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    assert report["quick"] is True
    assert report["errors"] == {}
    numbers = {scenario["number"] for scenario in report["scenarios"]}
    # 7 (peers) is skipped in quick mode; 11 (the structured-output stall) and 12 (prompt
    # caching, four turns) are quick themselves
    assert numbers == {1, 2, 3, 4, 5, 6, 11, 12, 13, 14}
    for scenario in report["scenarios"]:
        assert scenario["rows"], scenario["title"]
    by_number = {scenario["number"]: scenario for scenario in report["scenarios"]}
    # the harness observed what it claims to: runs completed, approvals landed, nothing lost
    relay = by_number[1]["raw"]["service"]
    assert all(level["ok"] == level["runs"] > 0 for level in relay.values())
    capacity = by_number[3]["raw"]["service"]
    assert capacity["statuses"] == {"completed": capacity["runs"]}
    drain = by_number[6]["raw"]
    assert all(phase["lost"] == 0 for phase in drain.values())
    # with caching on, every turn after the first read the one before it back
    caching = by_number[12]["raw"]
    assert all(turn["cached_input_tokens"] > 0 for turn in caching["per_turn"]["cached"][1:])
    assert caching["off"]["cached_input_tokens"] == 0 and caching["ratio"] < 1
    # every path with the image was measured, and each image reached the upstream
    image = by_number[13]["raw"]
    assert image["rounds"] > 0
    assert all(path["n"] == image["rounds"] for path in image["paths"].values())
    upstream = image["upstream"]
    assert upstream["large_requests"] == upstream["expected_large_requests"] > 0
    assert upstream["largest_body"] > image["image_bytes"]
    # every case of the cost per event streamed its runs to the end and was measured
    cost = by_number[14]["raw"]
    for cases in (cost["per_event"], cost["per_run"]):
        for case in cases.values():
            assert all(r["ok"] == r["runs"] > 0 for r in case["raw"]), case["raw"]
            assert all(us is not None for us in case["cpu_us"])  # 0 at a quick size: ticks
    assert any("Redis" in name for name in cost["per_event"])
    assert "quick" in report["command"]


@pytest.mark.redis
@pytest.mark.timeout(900)
def test_quick_run_of_the_redis_scenarios(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            "--quick",
            "--no-plots",
            "--scenario",
            "8",
            "--scenario",
            "9",
            "--scenario",
            "10",
            "--results",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    by_number = {scenario["number"]: scenario for scenario in report["scenarios"]}
    assert set(by_number) == {8, 9, 10}
    latency = by_number[8]["raw"]
    # every delay was measured (no "pending"), and the runs streamed to their end
    assert all("stream" in measured for measured in latency.values()), latency
    assert all(measured["stream"]["runs"] > 0 for measured in latency.values())
    # by code measured ("this", and "baseline <commit>" when one is named), then worker count
    codes = by_number[9]["raw"]
    assert "this" in codes, codes
    levels = [
        level for counts in codes.values() for count in counts.values() for level in count.values()
    ]
    assert levels, codes
    assert all(level["ok"] == level["runs"] > 0 for level in levels), levels
    # every run waiting on the stopped worker was handed over twice and then completed
    handover = by_number[10]["raw"]
    assert handover["completed"] == handover["runs"] > 0, handover
