"""Runtime tests run with asyncio's debug checks: a callback that blocks the loop fails the test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.loopcheck import no_blocking_calls


@pytest.fixture(autouse=True)
async def _no_blocking_calls() -> AsyncIterator[None]:
    with no_blocking_calls():
        yield
