"""Runtime tests run with asyncio's debug checks: a callback that blocks the loop fails the test."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

SLOW_CALLBACK = 1.0  # generous for a loaded 2-core CI machine; a blocking call still shows


class _SlowCallbackWatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "took" in message and "seconds" in message:
            self.records.append(message)


@pytest.fixture(autouse=True)
async def _no_blocking_calls() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    loop.slow_callback_duration = SLOW_CALLBACK
    loop.set_debug(True)
    watcher = _SlowCallbackWatcher()
    logger = logging.getLogger("asyncio")
    logger.addHandler(watcher)
    try:
        yield
    finally:
        logger.removeHandler(watcher)
        loop.set_debug(False)
    assert not watcher.records, f"the event loop was blocked: {watcher.records}"
