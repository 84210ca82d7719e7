"""Stopping a worker's background tasks for good.

One ``cancel()`` is normally enough to stop a task. On Python 3.11 it is not always:
``asyncio.wait_for`` drops a cancellation that arrives just as its inner future completes, and
redis-py waits for every write's drain that way (other client libraries use it too). A loop
cancelled at that instant goes on as if nothing had happened, and a shutdown waiting for it
waits forever. ``stop_tasks`` cancels again while a task is still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["stop_task", "stop_tasks"]

#: How long a cancelled task has to end before it is cancelled again: long enough for the
#: cleanup a cancellation starts (a connection given back), short enough for a shutdown.
AGAIN_AFTER: Final = 0.25


async def stop_tasks(
    tasks: Iterable[asyncio.Task[Any]], *, again_after: float = AGAIN_AFTER
) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again any still running
    after ``again_after`` seconds (its cancellation was swallowed). Their outcomes are left to
    their owners; a cancellation of the caller propagates."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)


async def stop_task(task: asyncio.Task[Any] | None, *, again_after: float = AGAIN_AFTER) -> None:
    """``stop_tasks`` for one task (or none)."""
    if task is not None:
        await stop_tasks((task,), again_after=again_after)
