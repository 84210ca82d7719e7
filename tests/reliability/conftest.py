"""The reliability suite's fixtures: a fake model upstream on loopback, shared by a module.

Every server is a real process started with ``tests.support.server.launch``; the helpers that
talk to it (the fake upstream's environment, probes, keys) live in ``tests/support``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fakes.upstream import FakeUpstream, Respond
from tests.support.authz import AUTHZ_ENV, Layout
from tests.support.server import launch, stop
from tests.support.services import shared_backend
from tests.support.upstream import demo_like


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    """A fake upstream (both wires) on a thread, answering like the demo model unless
    scripted."""
    with FakeUpstream.in_thread(default=Respond(demo_like)) as running:
        yield running


# --- the authorization matrices' layouts ---------------------------------------------------


@pytest.fixture(scope="module")
def one_worker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Layout]:
    """One worker on the default backend (SQLite, the in-process bus)."""
    failed = request.session.testsfailed
    server = launch(tmp_path_factory.mktemp("authz"), AUTHZ_ENV)
    yield Layout(server, server)
    stop(server, request, failed)


@pytest.fixture(scope="module")
def two_workers(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Layout]:
    """Two server processes on Redis and PostgreSQL: alice's objects made through the first,
    bob's attempts sent to the second."""
    failed = request.session.testsfailed
    with shared_backend() as shared:
        directories = [tmp_path_factory.mktemp(f"authz-{name}") for name in "ab"]
        with ThreadPoolExecutor(max_workers=2) as pool:
            one, two = pool.map(lambda where: launch(where, {**AUTHZ_ENV, **shared}), directories)
        try:
            yield Layout(one, two)
        finally:
            stop(one, request, failed)
            stop(two, request, failed)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("one_worker", id="one-worker"),
        pytest.param(
            "two_workers",
            id="two-workers",
            marks=[pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres],
        ),
    ],
)
def layout(request: pytest.FixtureRequest) -> Layout:
    """Each authorization test on one worker, and (slow) on two."""
    chosen: Layout = request.getfixturevalue(request.param)
    return chosen
