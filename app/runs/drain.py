"""Drain at shutdown: stop taking runs, let those in flight finish, then stop the rest.

Run ends the store could not take yet (``app.runs.final_write``) are retried until the drain's
budget is spent.

Runs waiting for an external answer are handed over at once, and a run still going when the
drain's budget is spent is handed over too where it can be (``app.runs.handover``); the rest
are cancelled with reason ``shutdown``.
"""

from __future__ import annotations

import asyncio
import logging

from app.runs.context import RunContext
from app.runs.final_write import FinalWrites
from app.runs.handover import HandOver
from app.runs.stopping import RunStopper

__all__ = ["Drain"]

logger = logging.getLogger("app.runs")

# after the drain deadline, how long cancelled runs get to deliver their terminal event
_CANCEL_GRACE = 10.0
# and how long their final writes get, when the store cannot be reached
_WRITE_GRACE = 1.0


class Drain:
    """This worker's drain; idempotent."""

    def __init__(
        self, context: RunContext, stopper: RunStopper, writes: FinalWrites, handover: HandOver
    ) -> None:
        self._handover = handover
        self._context = context
        self._stopper = stopper
        self._writes = writes
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
            # a run waiting for a person may wait for hours: handed over at once, not
            # drained (app.runs.handover)
            self._handover.park_waiting()

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain's own budget
        """Let runs finish for ``timeout`` seconds, then stop the rest.

        Concurrent and later callers wait for the same drain.
        """
        self.begin()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain(timeout))
        await asyncio.shield(self._task)

    async def _drain(self, budget: float) -> None:
        try:
            await self._settle(budget)
        finally:
            # the streams still open here end (no terminal event): their clients resume with
            # Last-Event-ID on another worker, or on this one after its restart
            drained = self._context.drained()
            if not drained.done():
                drained.set_result(None)

    async def _settle(self, budget: float) -> None:
        deadline = asyncio.get_running_loop().time() + budget
        if not await self._wait_idle(budget):
            await self.stop_remaining()
        # the ends the store could not take yet: retried for what is left of the budget
        # (at least a moment, for the runs just cancelled); aclose logs the rest
        left = max(deadline - asyncio.get_running_loop().time(), _WRITE_GRACE)
        unwritten = await self._writes.settle(left)
        if unwritten:
            logger.error(
                "drain timeout: the end of %d run(s) could not be stored",
                len(unwritten),
                extra={"runs": unwritten},
            )
        logger.info("drained")

    async def stop_remaining(self) -> None:
        """End the runs still held after the budget: handed over where they can be
        (``app.runs.handover``), else cancelled, reason ``shutdown``."""
        context = self._context
        left = [h for h in context.runs.values() if not self._handover.stop(h, streaming=True)]
        if len(left) < len(context.runs):
            logger.info(
                "drain timeout: handing over runs", extra={"runs": len(context.runs) - len(left)}
            )
        if left:
            logger.warning("drain timeout: cancelling runs", extra={"runs": len(left)})
        for handle in left:
            self._stopper.cancel_local(handle.run_id, "shutdown")
        if not await self._wait_idle(_CANCEL_GRACE):
            logger.error("runs did not end after cancellation", extra={"runs": len(context.runs)})

    async def _wait_idle(self, timeout: float) -> bool:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                await self._context.idle.wait()
        except TimeoutError:
            return False
        return True
