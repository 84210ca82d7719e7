"""asyncio's debug checks for tests: a callback that blocks the event loop fails the test."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

# generous for a loaded 2-core CI machine; a blocking call (a sync sleep, sync I/O) still shows
SLOW_CALLBACK = 1.0


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "took" in message and "seconds" in message:
            self.records.append(message)


@contextlib.contextmanager
def no_blocking_calls(threshold: float = SLOW_CALLBACK) -> Iterator[None]:
    """Within the block, a loop step longer than ``threshold`` seconds fails the test."""
    loop = asyncio.get_running_loop()
    previous = loop.get_debug(), loop.slow_callback_duration
    loop.slow_callback_duration = threshold
    loop.set_debug(True)
    watcher = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(watcher)
    try:
        yield
    finally:
        logger.removeHandler(watcher)
        loop.set_debug(previous[0])
        loop.slow_callback_duration = previous[1]
    assert not watcher.records, f"the event loop was blocked: {watcher.records}"
