"""The exception trees drawn in module docstrings match the real class hierarchies.

A tree is a literal block (after ``::``) whose first line names an exception class and whose
other lines hang names off ``├──`` and ``└──``. Every drawn name must be a class under its
drawn parent, and every class of the package deriving from the tree's root must be drawn (a
module that draws its own errors under a root defined elsewhere answers only for the
branches it draws).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType

import pytest

_PACKAGES = ("app", "agent_runtime")
_CONNECTOR = re.compile(r"[├└]── +([A-Za-z_]\w*)")
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Tree:
    module: str
    root: str
    # (name, drawn parent) in drawing order; the root has no entry
    edges: tuple[tuple[str, str], ...]


def _modules() -> list[ModuleType]:
    found = []
    for package in _PACKAGES:
        top = importlib.import_module(package)
        found.append(top)
        for info in pkgutil.walk_packages(top.__path__, f"{package}."):
            try:
                found.append(importlib.import_module(info.name))
            except ModuleNotFoundError as exc:
                # a module of an optional extra not installed (agent_runtime.local.bert needs
                # numpy, from the ``local`` extra): a plain ``uv run pytest`` has none of them
                if (exc.name or "").split(".")[0] in _PACKAGES:
                    raise
    return found


def _literal_blocks(doc: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    lines = doc.splitlines()
    for index, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        block: list[str] = []
        for following in lines[index + 1 :]:
            if following.strip() and not following.startswith(" "):
                break
            block.append(following)
        while block and not block[-1].strip():
            block.pop()
        # the block ends where the text comes back to the margin it started from
        body = [b for b in block if b.strip()]
        if body:
            indent = len(body[0]) - len(body[0].lstrip())
            cut = next(
                (i for i, b in enumerate(block) if b.strip() and len(b) - len(b.lstrip()) < indent),
                len(block),
            )
            blocks.append([b for b in block[:cut] if b.strip()])
    return blocks


def _parse(module: str, block: list[str]) -> Tree | None:
    first = block[0].strip()
    if not _NAME.fullmatch(first) or not any(_CONNECTOR.search(line) for line in block[1:]):
        return None
    edges: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = [(-1, first)]
    for line in block[1:]:
        match = _CONNECTOR.search(line)
        if match is None:
            continue  # a description carried over to the next line
        column = match.start()
        while stack[-1][0] >= column:
            stack.pop()
        edges.append((match.group(1), stack[-1][1]))
        stack.append((column, match.group(1)))
    return Tree(module, first, tuple(edges))


def _descendants(root: type) -> set[type]:
    found: set[type] = set()
    pending = [root]
    while pending:
        sub: type
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    return found


MODULES = _modules()
TREES = [
    tree
    for module in MODULES
    for block in _literal_blocks(module.__doc__ or "")
    if (tree := _parse(module.__name__, block)) is not None
]
# every exception class the packages define, by name
EXCEPTIONS: dict[str, type[BaseException]] = {
    name: value
    for module in MODULES
    for name, value in vars(module).items()
    if isinstance(value, type)
    and issubclass(value, BaseException)
    and value.__module__ == module.__name__
}
# the exception trees only (the bus draws its parts the same way)
ERROR_TREES = [tree for tree in TREES if tree.root in EXCEPTIONS]


def test_the_known_trees_are_found() -> None:
    assert {(tree.module, tree.root) for tree in ERROR_TREES} >= {
        ("app.errors", "ServiceError"),
        ("app.storage.base", "StorageError"),
        ("app.bus.base", "BusError"),
        ("agent_runtime.errors", "AgentRuntimeError"),
        ("agent_runtime.mcp.errors", "AgentRuntimeError"),
        ("agent_runtime.mcp", "AgentRuntimeError"),
    }


@pytest.mark.parametrize("tree", ERROR_TREES, ids=lambda tree: f"{tree.module}:{tree.root}")
def test_a_drawn_tree_matches_the_classes(tree: Tree) -> None:
    root = EXCEPTIONS[tree.root]
    package = tree.module.partition(".")[0]
    real = {
        cls.__name__: cls
        for cls in _descendants(root)
        if cls.__module__.partition(".")[0] == package and not cls.__name__.startswith("_")
    }
    real[root.__name__] = root

    for name, parent in tree.edges:
        assert name in real, f"{tree.module} draws {name}, which is no {tree.root} of {package}"
        assert parent in real, f"{tree.module} draws {parent}, which is no {tree.root}"
        assert real[parent] in real[name].__bases__, (
            f"{tree.module} draws {name} under {parent}; its bases are "
            f"{[base.__name__ for base in real[name].__bases__]}"
        )

    drawn = {name for name, _ in tree.edges}
    if root.__module__ == tree.module:
        branches = [root]
    else:
        branches = [real[name] for name, parent in tree.edges if parent == tree.root]
    for branch in branches:
        for cls in _descendants(branch):
            if cls.__name__ in real and real[cls.__name__] is cls:
                assert cls.__name__ in drawn, (
                    f"{cls.__module__}.{cls.__name__} derives from {branch.__name__} "
                    f"but the tree in {tree.module} does not draw it"
                )
