"""Several ``agent-server`` processes sharing the machine's Redis and PostgreSQL.

``start_cluster(count, env)`` starts ``count`` separate processes (``--workers 1`` each, on
ports of their own) at once, all on one Redis key prefix and one PostgreSQL schema made for
the test and removed after it. A failed test prints every server's log.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import CLUSTER_ENV, StartCluster
from tests.support.server import Server, launch
from tests.support.services import shared_backend


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            for marker in ("e2e", "redis", "postgres", "slow"):
                item.add_marker(marker)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture
def cluster_env() -> Iterator[dict[str, str]]:
    """This test's Redis prefix and PostgreSQL schema, as the servers' environment."""
    with shared_backend() as shared:
        yield {**CLUSTER_ENV, **shared}


@pytest.fixture
def start_cluster(
    tmp_path: Path, request: pytest.FixtureRequest, cluster_env: dict[str, str]
) -> Iterator[StartCluster]:
    """``start_cluster(count=3, env=None)``: that many servers on this test's shared Redis
    prefix and PostgreSQL schema (``env`` may override them, e.g. another Redis)."""
    servers: list[Server] = []

    def start(count: int = 3, env: dict[str, str] | None = None) -> list[Server]:
        environment = {**cluster_env, **(env or {})}
        first = len(servers)
        directories = [tmp_path / f"worker-{first + index}" for index in range(count)]
        with ThreadPoolExecutor(max_workers=count) as pool:
            started = list(pool.map(lambda where: launch(where, environment), directories))
        servers.extend(started)
        return started

    try:
        yield start
    finally:
        with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
            list(pool.map(lambda server: server.stop(), servers))
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for server in servers:
            print(f"--- {server.base_url} log ---\n{server.log()[-20000:]}")
