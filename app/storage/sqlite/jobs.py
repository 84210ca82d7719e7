"""The SQLite store's thread: jobs run one at a time, in the order they were submitted, and
each answer is handed back to the submitting event loop.

One hop per store operation is the store's hot path (a run makes a few), so it is kept to
what it needs: a queue put, a future, and one ``call_soon_threadsafe`` back, where
``loop.run_in_executor`` adds a ``concurrent.futures.Future`` (a condition variable and its
lock), the chaining of the two futures and the executor's own book-keeping.

A job once submitted runs whatever happens to its caller: a cancelled caller stops waiting
(its future is cancelled), the job still commits or rolls back on the thread, and a failure
nobody is left to see is logged. Jobs queued before ``stop`` all run first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["JobThread"]

logger = logging.getLogger("app.storage")

T = TypeVar("T")

_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", str, Callable[..., Any], tuple[Any, ...]
]


class JobThread:
    """A thread of its own that runs jobs in submission order (a daemon: a store left open
    does not hold the process at exit; SQLite rolls back what a killed job left undone)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, name: str, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Submit ``function(*args)`` (the operation ``name``, for the log); the future of its
        result, on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, name, function, args))
        return future

    def stop(self) -> None:
        """End the thread once the jobs already submitted have run."""
        self._jobs.put(None)

    def _work(self) -> None:
        jobs = self._jobs
        while _do(jobs.get()):
            pass


def _do(job: _Job | None) -> bool:
    """Run one job and hand its answer back; False at the end (its locals go with it, so
    nothing of the job is kept while the thread waits for the next)."""
    if job is None:
        return False
    loop, future, name, function, args = job
    try:
        result = function(*args)
    except BaseException as exc:  # handed to the caller, as an executor would
        answer: tuple[Any, BaseException | None] = (None, exc)
    else:
        answer = (result, None)
    # a loop already closed has nobody left to answer
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, future, name, *answer)
    return True


def _settle(
    future: asyncio.Future[Any], name: str, result: Any, error: BaseException | None
) -> None:
    if future.cancelled():
        if error is not None:
            logger.error(
                "storage operation %s failed after its caller was cancelled", name, exc_info=error
            )
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
