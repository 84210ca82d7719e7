"""The reliability suite's fixtures: a fake model upstream on loopback, shared by a module.

Every server is a real process started with ``tests.support.server.launch``; the helpers that
talk to it (the fake upstream's environment, probes, keys) live in ``tests/support``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.upstream import FakeUpstream, Respond
from tests.support.upstream import demo_like


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    """A fake upstream (both wires) on a thread, answering like the demo model unless
    scripted."""
    with FakeUpstream.in_thread(default=Respond(demo_like)) as running:
        yield running
