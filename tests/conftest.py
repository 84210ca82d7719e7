"""Shared test configuration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# the docs' examples and the shared helpers under tests/ are imported by path
ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

# the helpers' asserts explain their failures as the tests' own do
pytest.register_assert_rewrite("tests.support")
