"""Drain at shutdown: stop taking runs, let those in flight finish, then stop the rest.

What happens to a run still going when the drain's budget is spent is ``stop_remaining``'s
choice: today every such run is cancelled with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging

from app.runs.context import RunContext
from app.runs.routing import Routing

__all__ = ["Drain"]

logger = logging.getLogger("app.runs")

# after the drain deadline, how long cancelled runs get to deliver their terminal event
_CANCEL_GRACE = 10.0


class Drain:
    """This worker's drain; idempotent."""

    def __init__(self, context: RunContext, routing: Routing) -> None:
        self._context = context
        self._routing = routing
        self._task: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """Stop taking runs (readiness 503, new runs 503); idempotent and synchronous."""
        context = self._context
        if not context.draining:
            context.draining = True
            context.admission.close(
                "this server is shutting down and takes no new runs; retry on another instance"
            )
            logger.info("draining", extra={"runs": len(context.runs)})

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain's own budget
        """Let runs finish for ``timeout`` seconds, then stop the rest.

        Concurrent and later callers wait for the same drain.
        """
        self.begin()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(timeout))
        await asyncio.shield(self._task)

    async def _drain(self, budget: float) -> None:
        if not await self._wait_idle(budget):
            await self.stop_remaining()
        logger.info("drained")

    async def stop_remaining(self) -> None:
        """End the runs still held after the budget: cancelled, reason ``shutdown``."""
        context = self._context
        left = list(context.runs)
        logger.warning("drain timeout: cancelling runs", extra={"runs": len(left)})
        for run_id in left:
            self._routing.cancel_local(run_id, "shutdown")
        if not await self._wait_idle(_CANCEL_GRACE):
            logger.error("runs did not end after cancellation", extra={"runs": len(context.runs)})

    async def _wait_idle(self, timeout: float) -> bool:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                await self._context.idle.wait()
        except TimeoutError:
            return False
        return True
