"""Fixtures for the protocols' own suites and clients, run against a real server process.

Every test here is an end-to-end test (``e2e``): a server process over loopback, driven by a
protocol's official client, its conformance suite, or raw HTTP where the point is the header.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)
