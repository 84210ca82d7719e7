"""The import graph holds the architecture (docs/architecture.md).

Every import counts: at the top of a module, under ``if TYPE_CHECKING:`` and inside functions.
``from package import name`` is an import of ``package.name`` when that is a module. The rules:

- no import circle among the modules of ``app`` and ``agent_runtime``;
- ``agent_runtime`` imports nothing of ``app``, the web framework, the databases or Redis;
- a part of ``app`` imports only parts of its own layer or of the layers below it (``LAYERS``),
  but for the few edges in ``EXCEPTIONS``, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "agent_runtime")

# app's parts, top to bottom: a part may import its own layer and the layers below it
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"app", "main", "cli"}),  # the ASGI app and the command line
    frozenset({"http"}),  # routes and protocols; they reach the worker through server.services
    frozenset({"server"}),  # a worker: lifespan, services, readiness, supervisor, guard
    frozenset(
        {"auth", "agents", "admission", "runs", "schedules", "webhooks", "capabilities", "files"}
    ),  # the service's domain
    frozenset({"telemetry"}),  # logs, metrics, traces of everything above
    frozenset({"bus", "storage"}),  # shared state: the event logs and locks, the records
    frozenset({"settings", "errors", "tasks"}),  # AGENT_* variables, error tree, task stopping
)

EXCEPTIONS: Mapping[tuple[str, str], str] = {
    ("app.settings", "app.admission.budgets"): (
        "AGENT_BUDGETS is parsed by the budgets' own parser, which imports only app.errors"
    ),
    ("app.settings", "app.webhooks.signing"): (
        "the webhook secrets are parsed by the signing module, which imports nothing of app"
    ),
    ("app.telemetry.metrics", "app.server.http_protocol"): (
        "the metrics read the connection guard's per-process counts; the guard runs under "
        "the ASGI app and imports nothing of app"
    ),
}

# what the runtime must never import: it is a library, embeddable without the service
RUNTIME_FORBIDDEN = ("app", "fastapi", "starlette", "asyncpg", "redis")


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    target: str
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages under ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imports(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[Import]:
    """Every import in the module, wherever it is, as the name it imports (a module of
    ``known`` when ``from x import y`` names one, else what the statement names)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield Import(name, sub if sub in known else target, node.lineno)


def resolve(target: str, known: Mapping[str, Path]) -> str | None:
    """The module of ``known`` an import lands in (its nearest known parent), if any."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def graph(known: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``known`` it imports."""
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for found in imports(name, path, known):
            target = resolve(found.target, known)
            if target is not None and target != name:
                edges[name].add(target)
    return edges


def circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str) -> int | None:
    """The layer of an ``app`` module (by its part: ``app.runs.start`` -> ``runs``)."""
    parts = module.split(".")
    if parts[0] != "app":
        return None
    part = parts[1] if len(parts) > 1 else "app"
    for level, members in enumerate(LAYERS):
        if part in members:
            return level
    raise AssertionError(f"{module}: app.{part} is in no layer; add it to LAYERS")


def layer_breaches(edges: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of ``app`` that go up a layer, exceptions aside."""
    found: list[tuple[str, str]] = []
    for source, targets in sorted(edges.items()):
        here = layer_of(source)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is not None and there < here and (source, target) not in EXCEPTIONS:
                found.append((source, target))
    return found


def runtime_breaches(known: Mapping[str, Path]) -> list[str]:
    """The imports in ``agent_runtime`` of what it must not import."""
    found: list[str] = []
    for name, path in known.items():
        if name.partition(".")[0] != "agent_runtime":
            continue
        for found_import in imports(name, path, known):
            top = found_import.target.partition(".")[0]
            if top in RUNTIME_FORBIDDEN:
                found.append(f"{name}:{found_import.line} imports {found_import.target}")
    return found


KNOWN = modules(ROOT)
EDGES = graph(KNOWN)


def test_no_import_circle() -> None:
    found = circles(EDGES)
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_runtime_imports_nothing_of_the_service() -> None:
    found = runtime_breaches(KNOWN)
    assert found == [], "\n".join(found)


def test_app_imports_follow_the_layers() -> None:
    found = layer_breaches(EDGES)
    assert found == [], "imports up a layer:\n" + "\n".join(f"{s} -> {t}" for s, t in found)


@pytest.mark.parametrize("edge", sorted(EXCEPTIONS))
def test_each_exception_is_still_an_import(edge: tuple[str, str]) -> None:
    source, target = edge
    assert target in EDGES[source], f"{source} no longer imports {target}: drop the exception"


# the checks themselves, on a small tree of their own


def _tree(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return modules(root)


def test_a_circle_through_a_type_only_or_local_import_is_found(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/runs/__init__.py": "",
            "app/runs/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from app.runs import b\n",
            "app/runs/b.py": "def f() -> None:\n    from .c import x\n",
            "app/runs/c.py": "from . import a\nx = 1\n",
        },
    )
    assert circles(graph(known)) == [["app.runs.a", "app.runs.b", "app.runs.c"]]


def test_an_import_up_a_layer_is_found(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/storage/__init__.py": "",
            "app/storage/base.py": "def f() -> None:\n    from app.runs.start import go\n",
            "app/runs/__init__.py": "",
            "app/runs/start.py": "from app.storage import base\ndef go() -> None: ...\n",
        },
    )
    edges = graph(known)
    assert layer_breaches(edges) == [("app.storage.base", "app.runs.start")]


def test_the_runtime_importing_the_service_is_found(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "agent_runtime/__init__.py": "",
            "agent_runtime/tools.py": "def f() -> None:\n    import redis.asyncio\n",
        },
    )
    assert runtime_breaches(known) == ["agent_runtime.tools:2 imports redis.asyncio"]
