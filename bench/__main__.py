"""The benchmark harness.

    uv run python -m bench run [--quick] [--scenario N ...] [--no-peers] [--no-plots]
    uv run python -m bench docs [bench/results/latest.json]

Starts every server it measures on 127.0.0.1, drives it from a load generator in a process of
its own, prints a table per scenario, writes ``bench/results/<timestamp>.json`` (and
``latest.json``) and the plots ``docs/images/bench-*.png``. ``--quick`` (CI) runs every
scenario at a tiny size, skips the peers and writes its results to ``bench/results/quick/``
without touching the plots. ``docs`` rewrites the results section of docs/benchmarks.md from
a results file. Scenarios 8, 9 and 10 (Redis farther away, two workers, hand-over) run in
``--quick`` only when named (``--scenario 8``). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.event_cost import scenario_event_cost
from bench.handover import scenario_handover
from bench.image_input import scenario_image_input
from bench.outcome import Config, Outcome
from bench.peers import scenario_peers
from bench.procs import ROOT
from bench.prompt_caching import scenario_prompt_caching
from bench.redis_latency import scenario_redis_latency, scenario_workers
from bench.report import markdown_report, print_outcome, write_plots
from bench.scenarios import SCENARIOS
from bench.structured import scenario_structured

__all__ = ["main", "run"]

ALL = {
    **SCENARIOS,
    7: scenario_peers,
    8: scenario_redis_latency,
    9: scenario_workers,
    10: scenario_handover,
    11: scenario_structured,
    12: scenario_prompt_caching,
    13: scenario_image_input,
    14: scenario_event_cost,
}
REDIS_SCENARIOS = (8, 9, 10)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    freq = psutil.cpu_freq()
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model or platform.processor(),
        "cores": psutil.cpu_count(logical=True),
        "cpu_mhz": round(freq.current) if freq else None,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def background_cpu(seconds: float = 1.0) -> float:
    """CPU% (of the whole machine, 100 = every core busy) used by others before a scenario.

    The harness's own servers are stopped between scenarios, so this is other work on the
    machine: a figure taken while it is high is noisy.
    """
    psutil.cpu_percent(interval=None)
    time.sleep(seconds)
    return float(psutil.cpu_percent(interval=None))


def runtime_overhead(quick: bool) -> str:
    """The runtime's own micro-benchmark (bench/runtime_overhead.py), its table as printed."""
    args = ["--deltas", "2000", "--repeat", "3"] if quick else []
    done = subprocess.run(
        [sys.executable, "-m", "bench.runtime_overhead", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr[-500:]}"


def run(cfg: Config, numbers: list[int], plots: bool) -> dict[str, Any]:
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    errors: dict[int, str] = {}
    for number in numbers:
        if number == 7 and not cfg.peers:
            print("\n7. Peers: skipped (--quick or --no-peers)")
            continue
        noise = background_cpu(0.5 if cfg.quick else 2.0)
        begin = time.perf_counter()
        print(
            f"\n[{datetime.now(UTC):%H:%M:%S}] scenario {number} "
            f"(machine busy with other work: {noise:.0f}% CPU) ...",
            flush=True,
        )
        try:
            outcome = ALL[number](cfg)
        except Exception as exc:
            errors[number] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            continue
        outcome.seconds = time.perf_counter() - begin
        outcome.background_cpu_pct = noise
        if noise > 10:
            outcome.notes.append(
                f"the machine was busy with other work before this scenario ({noise:.0f}% CPU): "
                "its figures are noisier than on a quiet machine"
            )
        outcomes.append(outcome)
        print_outcome(outcome)
    overhead = runtime_overhead(cfg.quick)
    print("\nRuntime micro-benchmark (python -m bench.runtime_overhead):\n" + overhead)
    total = time.perf_counter() - started
    report = {
        "runtime_overhead": overhead,
        "command": "python -m bench " + " ".join(sys.argv[1:]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": cfg.quick,
        "machine": machine(),
        "seconds": total,
        "scenarios": [outcome.to_dict() for outcome in outcomes],
        "errors": errors,
    }
    out_dir = cfg.results_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for name in (f"{stamp}.json", "latest.json"):
        (out_dir / name).write_text(json.dumps(report, indent=1, default=str))
    (out_dir / "latest.md").write_text(markdown_report(outcomes))
    if plots and not cfg.quick:
        for path in write_plots(outcomes):
            print(f"plot: {path}")
    print(f"\nresults: {out_dir / 'latest.json'}   total time: {total:.0f} s")
    missed = [f"{o.number}: {t.name}" for o in outcomes for t in o.targets if t.met is False]
    if missed:
        print("targets missed:\n  " + "\n  ".join(missed))
    if errors:
        print("scenarios that failed: " + ", ".join(str(n) for n in errors))
    return report


START = "<!-- bench:results:start -->"
END = "<!-- bench:results:end -->"


def update_docs(results: list[Path], doc: Path) -> None:
    """Rewrite the results section of ``doc`` (between the markers) and the plots from
    results files.

    With several files, a scenario of a later file replaces the same scenario of an earlier
    one (a scenario re-run on its own); the header names the first file's run.
    """
    report = json.loads(results[0].read_text())
    by_number = {item["number"]: item for item in report["scenarios"]}
    for extra in results[1:]:
        for item in json.loads(extra.read_text())["scenarios"]:
            item["notes"] = [
                *item.get("notes", []),
                f"re-run on its own: {extra.parent.name}/{extra.name}",
            ]
            by_number[item["number"]] = item
    outcomes = [Outcome.from_dict(by_number[number]) for number in sorted(by_number)]
    machine_info = report["machine"]
    header = (
        f"Run of {report['when']} (`{report.get('command', 'python -m bench run')}`, "
        f"{report['seconds']:.0f} s) on {machine_info['cpu']}, {machine_info['cores']} cores, "
        f"{machine_info['memory_gib']} GiB, Python {machine_info['python']}.\n\n"
    )
    text = doc.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{doc} has no {START} ... {END} section")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    body = header + markdown_report(outcomes)
    if report.get("runtime_overhead"):
        body += (
            "\n### The runtime's own cost per event (`python -m bench.runtime_overhead`)\n\n"
            f"```\n{report['runtime_overhead']}\n```\n"
        )
    doc.write_text(f"{before}{START}\n{body}\n{END}{after}")
    for path in write_plots(outcomes):
        print(f"plot: {path}")
    print(f"updated {doc} from {', '.join(str(path) for path in results)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="run the scenarios")
    runner.add_argument("--quick", action="store_true", help="tiny sizes, no peers (CI)")
    runner.add_argument(
        "--scenario", type=int, action="append", choices=sorted(ALL), help="repeatable"
    )
    runner.add_argument("--no-peers", action="store_true", help="skip scenario 7")
    runner.add_argument("--no-plots", action="store_true", help="write no PNG")
    runner.add_argument("--results", type=Path, help="results folder (bench/results)")
    docs = sub.add_parser("docs", help="rewrite docs/benchmarks.md's results from a run")
    docs.add_argument(
        "results",
        nargs="*",
        type=Path,
        help="results files (default bench/results/latest.json); later ones replace scenarios",
    )
    docs.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    if not getattr(args, "no_plots", False) and importlib.util.find_spec("matplotlib") is None:
        # found now, not after minutes of measuring
        parser.error(
            "the plots need matplotlib, of the bench dependency group: "
            "uv run --group bench python -m bench ..."
            + ("" if args.command == "docs" else " (or --no-plots)")
        )
    if args.command == "docs":
        update_docs(args.results or [Config().results_dir / "latest.json"], args.doc)
        return 0
    cfg = Config(quick=args.quick, peers=not (args.quick or args.no_peers))
    if args.results is not None:
        cfg = replace(cfg, results_dir=args.results)
    elif args.quick:
        cfg = replace(cfg, results_dir=cfg.results_dir / "quick")
    # the Redis scenarios start many servers: a quick run takes them only when named
    default = [n for n in ALL if not (args.quick and n in REDIS_SCENARIOS)]
    report = run(cfg, sorted(set(args.scenario or default)), plots=not args.no_plots)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
