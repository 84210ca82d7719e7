"""What a scenario is given and what it answers: its size (``Config``), its targets and its
``Outcome`` (rows for the table, targets met or missed, the raw figures)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import ROOT

__all__ = ["Config", "Outcome", "Target"]


@dataclass(frozen=True)
class Config:
    """How big a run is: ``quick`` for CI (seconds), else the documented sizes."""

    quick: bool = False
    peers: bool = True
    results_dir: Path = ROOT / "bench" / "results"
    redis_url: str = "redis://127.0.0.1:6379/13"

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


@dataclass
class Target:
    """One target: ``value`` against ``limit`` (``<=`` or ``>=``)."""

    name: str
    value: float | None
    limit: float
    op: str = "<="
    unit: str = ""
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "op": self.op,
            "unit": self.unit,
            "met": self.met,
            "note": self.note,
        }


@dataclass
class Outcome:
    """What a scenario measured."""

    number: int
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    background_cpu_pct: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        targets = [
            Target(t["name"], t["value"], t["limit"], t["op"], t["unit"], t.get("note", ""))
            for t in data.get("targets", [])
        ]
        return cls(
            number=data["number"],
            title=data["title"],
            columns=list(data.get("columns", [])),
            rows=[list(row) for row in data.get("rows", [])],
            targets=targets,
            notes=list(data.get("notes", [])),
            raw=dict(data.get("raw", {})),
            seconds=float(data.get("seconds", 0.0)),
            background_cpu_pct=data.get("background_cpu_pct"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "targets": [target.to_dict() for target in self.targets],
            "notes": self.notes,
            "raw": self.raw,
            "seconds": self.seconds,
            "background_cpu_pct": self.background_cpu_pct,
        }
