"""The SQLite store's thread: jobs run one at a time, in the order they were submitted, and
each answer is handed back to the submitting event loop.

One hop per store operation is the store's hot path (a run makes a few), so it is kept to
what it needs: a queue put, a future, and one ``call_soon_threadsafe`` back, where
``loop.run_in_executor`` adds a ``concurrent.futures.Future`` (a condition variable and its
lock), the chaining of the two futures and the executor's own book-keeping.

A job once submitted runs whatever happens to its caller: a cancelled caller stops waiting
(its future is cancelled), the job still commits or rolls back on the thread, and a failure
nobody is left to see is logged. Jobs queued before ``stop`` all run first.

``idle`` says whether every job submitted so far has been answered, and ``on_idle`` is told
each time that becomes true: the store runs its short operations on the loop only then
(``app.storage.sqlite.loop_connection``), so the order of submission stays the order of
execution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["JobThread", "settle"]

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
        self._pending = 0
        self.on_idle: Callable[[], None] | None = None
        """Called on the loop each time the last job in flight has been answered."""
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Whether every job submitted has run and been answered."""
        return self._pending == 0

    def run(self, name: str, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Submit ``function(*args)`` (the operation ``name``, for the log); the future of its
        result, on the running loop."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.submit(future, name, function, *args)
        return future

    def submit(
        self, future: asyncio.Future[T], name: str, function: Callable[..., T], *args: Any
    ) -> None:
        """Submit ``function(*args)``, whose answer settles ``future`` (of the running loop)."""
        self._pending += 1
        self._jobs.put((future.get_loop(), future, name, function, args))

    def stop(self) -> None:
        """End the thread once the jobs already submitted have run."""
        self._jobs.put(None)

    def _answered(self) -> None:
        self._pending -= 1
        if not self._pending and self.on_idle is not None:
            self.on_idle()

    def _work(self) -> None:
        jobs = self._jobs
        answered = self._answered
        while _do(jobs.get(), answered):
            pass


def _do(job: _Job | None, answered: Callable[[], None]) -> bool:
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
        loop.call_soon_threadsafe(_answer, answered, future, name, *answer)
    return True


def _answer(
    answered: Callable[[], None],
    future: asyncio.Future[Any],
    name: str,
    result: Any,
    error: BaseException | None,
) -> None:
    try:
        settle(future, name, result, error)
    finally:
        answered()


def settle(
    future: asyncio.Future[Any], name: str, result: Any, error: BaseException | None
) -> None:
    """Give ``future`` the operation's result or error; one nobody waits for any more is
    logged if it failed."""
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
