"""asyncio's debug checks for tests: a callback that blocks the event loop fails the test.

A step's time includes the garbage collector's pauses, which are no blocking call of ours: a
full collection of the test process's large heap (every test module is loaded) takes 0.1-0.2 s
on an idle machine and several times that on a loaded one. The pauses that ended within a
slow step are taken off its time before it counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

# generous for a loaded 2-core CI machine; a blocking call (a sync sleep, sync I/O) still shows
SLOW_CALLBACK = 1.0

_TOOK = re.compile(r"took (\d+(?:\.\d+)?) seconds")


class _Collections:
    """The garbage collector's recent pauses, as (end, duration) on the monotonic clock."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = now
        else:
            self.pauses.append((now, now - self._started))
            del self.pauses[:-64]

    def within(self, seconds: float) -> float:
        """Seconds of pauses that ended in the last ``seconds``."""
        since = time.monotonic() - seconds
        return sum(duration for end, duration in self.pauses if end >= since)


class _SlowCallbacks(logging.Handler):
    def __init__(self, threshold: float, collections: _Collections) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self._threshold = threshold
        self._collections = collections

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        took = _TOOK.search(message)
        if took is None:
            return
        seconds = float(took.group(1))
        if seconds - self._collections.within(seconds) >= self._threshold:
            self.records.append(message)


@contextlib.contextmanager
def no_blocking_calls(threshold: float = SLOW_CALLBACK) -> Iterator[None]:
    """Within the block, a loop step longer than ``threshold`` seconds (not counting the
    garbage collector's pauses) fails the test."""
    loop = asyncio.get_running_loop()
    previous = loop.get_debug(), loop.slow_callback_duration
    loop.slow_callback_duration = threshold
    loop.set_debug(True)
    collections = _Collections()
    gc.callbacks.append(collections)
    watcher = _SlowCallbacks(threshold, collections)
    logger = logging.getLogger("asyncio")
    logger.addHandler(watcher)
    try:
        yield
    finally:
        logger.removeHandler(watcher)
        gc.callbacks.remove(collections)
        loop.set_debug(previous[0])
        loop.slow_callback_duration = previous[1]
    assert not watcher.records, f"the event loop was blocked: {watcher.records}"
