"""Shared helpers live in ``tests/support``: no test module imports another test module or a
conftest (conftests hold fixtures and hooks, which pytest finds by itself)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported(source: str, module: str) -> list[str]:
    """The absolute names the code of ``module`` imports (``from x import y`` counts both
    ``x`` and ``x.y``, since ``y`` may be a module)."""
    package = module.split(".")[:-1]
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            named = ".".join([*base, *([node.module] if node.module else [])])
            names.append(named)
            names.extend(f"{named}.{alias.name}" for alias in node.names)
    return names


def is_test_or_conftest(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(
        part == "conftest" or part.startswith("test_") for part in parts[1:]
    )


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}: {name}"
        for path in sorted(TESTS.rglob("*.py"))
        if "node_modules" not in path.parts
        for name in imported(
            path.read_text(encoding="utf-8"),
            ".".join(path.relative_to(TESTS.parent).with_suffix("").parts),
        )
        if is_test_or_conftest(name)
    ]
    assert found == [], "import these from tests/support instead:\n" + "\n".join(found)


def test_the_check_sees_absolute_and_relative_imports() -> None:
    source = (
        "from tests.e2e.conftest import launch\n"
        "from .conftest import Server\n"
        "from . import test_ui\n"
        "import tests.scale.test_cluster\n"
        "from tests.support.server import launch as start\n"
        "from tests.fakes.upstream import FakeUpstream\n"
    )
    names = imported(source, "tests.e2e.test_example")
    assert sorted({name for name in names if is_test_or_conftest(name)}) == [
        "tests.e2e.conftest",
        "tests.e2e.conftest.Server",
        "tests.e2e.conftest.launch",
        "tests.e2e.test_ui",
        "tests.scale.test_cluster",
    ]
