"""Tables on stdout and PNG plots (matplotlib, Agg) for the scenarios' outcomes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.outcome import Outcome
from bench.procs import ROOT

__all__ = [
    "IMAGES",
    "format_cell",
    "markdown_report",
    "markdown_table",
    "print_outcome",
    "write_plots",
]

IMAGES = ROOT / "docs" / "images"


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[list[str]]:
    return [list(columns), *[[format_cell(cell) for cell in row] for row in rows]]


def print_outcome(outcome: Outcome) -> None:
    print(f"\n{outcome.number}. {outcome.title}  ({outcome.seconds:.0f} s)")
    table = _table(outcome.columns, outcome.rows)
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(table[0]))]
    for index, row in enumerate(table):
        print("  " + "  ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)))
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))
    for target in outcome.targets:
        met = {True: "met", False: "MISSED", None: "n/a"}[target.met]
        print(
            f"  target: {target.name}: {format_cell(target.value)} {target.unit} "
            f"({target.op} {format_cell(float(target.limit))}) {met}"
        )
    for note in outcome.notes:
        print(f"  note: {note}")


def markdown_table(outcome: Outcome) -> str:
    table = _table(outcome.columns, outcome.rows)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines.extend("| " + " | ".join(row) + " |" for row in table[1:])
    return "\n".join(lines)


def markdown_report(outcomes: Sequence[Outcome]) -> str:
    """Every scenario's table, targets and notes, as Markdown (for docs/benchmarks.md)."""
    parts: list[str] = []
    for outcome in outcomes:
        parts.append(f"### {outcome.number}. {outcome.title}\n")
        parts.append(markdown_table(outcome) + "\n")
        if outcome.targets:
            parts.append("| target | measured | limit | met |\n|---|---|---|---|")
            for target in outcome.targets:
                met = {True: "met", False: "**missed**", None: "n/a"}[target.met]
                parts.append(
                    f"| {target.name} | {format_cell(target.value)} {target.unit} | "
                    f"{target.op} {format_cell(float(target.limit))} | {met} |"
                )
            parts.append("")
        parts.extend(f"- {note}" for note in outcome.notes)
        parts.append("")
    return "\n".join(parts)


# --- plots ----------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    ax: Any, groups: Sequence[str], series: Mapping[str, Sequence[float | None]], ylabel: str
) -> None:
    count = len(series)
    width = 0.8 / max(1, count)
    for index, (name, values) in enumerate(series.items()):
        xs = [i + (index - (count - 1) / 2) * width for i in range(len(groups))]
        heights = [0.0 if v is None else float(v) for v in values]
        bars = ax.bar(xs, heights, width, label=name)
        for bar, value in zip(bars, values, strict=True):
            if value is None:
                label = "n/a"
            elif float(value).is_integer() and abs(float(value)) < 1e15:
                label = format_cell(int(value))
            else:
                label = format_cell(float(value))
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _plot_relay(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    # int keys in a fresh outcome, str keys once read back from JSON
    levels = sorted(raw["service"], key=int)
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(
        ax,
        [f"{c} clients" for c in levels],
        {
            "agent-server": [raw["service"][c]["events_per_s"] for c in levels],
            "minimal sse-starlette": [raw["baseline"][c]["events_per_s"] for c in levels],
        },
        "events / s",
    )
    ax.set_title(f"1. Relay, one worker, {raw['words']} words per run")
    return fig


def _plot_latency(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(
        ax,
        ["p50", "p90", "p99"],
        {
            "upstream directly (openai SDK)": [raw["direct"][k] for k in ("p50", "p90", "p99")],
            "through agent-server": [raw["service"][k] for k in ("p50", "p90", "p99")],
        },
        "time to first text delta (ms)",
    )
    ax.set_title("2. Time to first event: service vs the upstream directly")
    return fig


def _plot_capacity(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(
        ax,
        ["memory per waiting run (KiB)"],
        {
            "agent-server (background run at a confirmation)": [
                raw["service"]["bytes_per_run"] / 1024
            ],
            "floor: parked asyncio task in a Starlette app": [
                raw["baseline"]["bytes_per_run"] / 1024
            ],
        },
        "KiB",
    )
    ax.axhline(20, color="red", linestyle="--", linewidth=1, label="target 20 KiB")
    ax.set_title(f"3. {raw['service']['runs']:,} runs waiting in one worker")
    return fig


def _plot_confirm(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    series: dict[str, Sequence[float | None]] = {}
    names = {"floor": "floor (sse-starlette)", "local": "one worker", "redis": "two via Redis"}
    for key, name in names.items():
        result = raw.get(key, {})
        if "round_trip" in result:
            series[name] = [result["round_trip"][k] for k in ("p50", "p90", "p99")]
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, ["p50", "p90", "p99"], series, "POST → tool.call.completed (ms)")
    ax.set_title("4. Confirmation round trip")
    return fig


def _plot_overload(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    q0 = raw["q0"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    _bars(
        ax1,
        ["p50", "p99"],
        {
            "unloaded (1 client)": [q0["unloaded"]["admitted_ttfe"].get(k) for k in ("p50", "p99")],
            "at capacity (C clients)": [
                q0["capacity"]["admitted_ttfe"].get(k) for k in ("p50", "p99")
            ],
            "3x capacity": [q0["overload"]["admitted_ttfe"].get(k) for k in ("p50", "p99")],
        },
        "admitted runs' TTFE (ms), Q=0",
    )
    series = {
        f"Q={key[1:]}": [raw[key]["overload"]["rejected"].get(k) for k in ("p50", "p99")]
        for key in raw
        if raw[key]["overload"]["rejected"].get("n")
    }
    _bars(ax2, ["p50", "p99"], series, "429 answer time (ms)")
    ax2.axhline(5, color="red", linestyle="--", linewidth=1)
    fig.suptitle("5. Overload at 3x capacity")
    return fig


def _plot_drain(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    keys = list(raw)
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(
        ax,
        [f"drain timeout {k} s" for k in keys],
        {
            "completed": [raw[k]["outcomes"].get("completed", 0) for k in keys],
            "cancelled: shutdown": [raw[k]["outcomes"].get("cancelled:shutdown", 0) for k in keys],
            "lost": [raw[k].get("lost", 0) for k in keys],
        },
        "runs",
    )
    ax.set_title("6. Drain on SIGTERM: how each run ended")
    return fig


def _plot_peers(outcome: Outcome, plt: Any) -> Any:
    raw = outcome.raw
    relay = raw.get("relay", {})
    servers = [name for name in relay if isinstance(relay[name], dict) and relay[name]]
    levels = sorted({int(c) for name in servers for c in relay[name]})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    _bars(
        ax1,
        [f"{c} clients" for c in levels],
        {
            name: [
                relay[name].get(str(c), relay[name].get(c, {})).get("deltas_per_s") for c in levels
            ]
            for name in servers
        },
        "text deltas / s",
    )
    ax1.set_title("relay (words streamed per second)")
    ax1.set_yscale("log")
    memory = raw.get("memory", {})
    names = [name for name in memory if memory[name].get("bytes_per_unit") is not None]
    _bars(
        ax2,
        ["memory per waiting unit (KiB)"],
        {name: [memory[name]["bytes_per_unit"] / 1024] for name in names},
        "KiB",
    )
    ax2.set_title("waiting (see the table for what a unit is)")
    fig.suptitle("7. Peers on the same machine and load generator")
    return fig


_PLOTS: dict[int, tuple[str, Callable[[Outcome, Any], Any]]] = {
    1: ("bench-relay.png", _plot_relay),
    2: ("bench-latency.png", _plot_latency),
    3: ("bench-capacity.png", _plot_capacity),
    4: ("bench-confirm.png", _plot_confirm),
    5: ("bench-overload.png", _plot_overload),
    6: ("bench-drain.png", _plot_drain),
    7: ("bench-peers.png", _plot_peers),
}


def write_plots(outcomes: Sequence[Outcome], directory: Path = IMAGES) -> list[Path]:
    """One PNG per scenario that has a plot; the paths written."""
    plt = _plt()
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for outcome in outcomes:
        entry = _PLOTS.get(outcome.number)
        if entry is None:
            continue
        name, plot = entry
        try:
            fig = plot(outcome, plt)
        except (KeyError, TypeError, ValueError) as exc:
            print(f"no plot for scenario {outcome.number}: {exc}")
            continue
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
