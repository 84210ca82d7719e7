"""Fixtures for tests against a real ``agent-server`` process (``tests.support.server``).

The environment given by the test is the server's; ``start_server`` and ``server`` stop the
process at the end, showing its log if a test failed.

The contract suites (``test_server.py``, ``test_lifecycle.py``) run once per backend:
``default`` (SQLite, the in-process bus) and ``redis+postgres`` (the machine's Redis and
PostgreSQL, with a key prefix and a schema of the test's own, removed afterwards).
``AGENT_TEST_BACKENDS=default`` (or ``redis+postgres``) selects one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import Launch, Server, backend_env, launch, selected_backends

# the modules whose tests run on every backend
_ON_EVERY_BACKEND = frozenset({"test_server", "test_lifecycle"})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rpartition(".")[2]
    if "backend" in metafunc.fixturenames and module in _ON_EVERY_BACKEND:
        metafunc.parametrize("backend", selected_backends(), indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of the servers a test starts: ``default`` unless parametrized."""
    name: str = getattr(request, "param", "default")
    return name


@pytest.fixture
def start_server(tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> Iterator[Launch]:
    """``start_server(env, workers=1, directory=None)``: a server for this test, stopped
    afterwards; ``directory`` reuses another server's files (a restart). All the servers of
    a test share its backend (their database, and Redis)."""
    servers: list[Server] = []
    with backend_env(backend) as shared:

        def start(
            env: dict[str, str] | None = None, *, workers: int = 1, directory: Path | None = None
        ) -> Server:
            where = directory or tmp_path / f"server-{len(servers)}"
            server = launch(where, {**shared, **(env or {})}, workers=workers)
            servers.append(server)
            return server

        yield start
        for server in servers:
            server.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for server in servers:
            print(f"--- {server.base_url} log ---\n{server.log()[-20000:]}")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[Server]:
    """One shared server per backend (tests use their own session ids)."""
    with backend_env(backend) as shared:
        running = launch(tmp_path_factory.mktemp("shared-server"), shared)
        yield running
        running.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
