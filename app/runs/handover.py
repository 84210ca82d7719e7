"""Hand-over at shutdown: runs that can go on elsewhere are parked, not cancelled.

::

    SIGTERM (drain begins)
      waiting runs (an external answer pending): parked at once
      streaming runs: AGENT_DRAIN_TIMEOUT to finish, then parked (shared bus only)
    parking a run: the runtime's run is cancelled with reason ``handover`` (it stores no
      stopped turn) → its checkpoint marked ``handover = shutdown`` (fenced) → no terminal
      event, no final write: the run stays unfinished in the store and its log unsealed →
      the session lease released, the route dropped
    then: any worker's sweep (shared bus) or the restart (one worker, SQLite) finds a run no
      worker holds, with a checkpoint, and resumes it there (``app.runs.resume``): its
      readers, on any worker, see ``run.resumed`` (``reason: shutdown``) and the rest

A confirmation a parked run waits for stays pending: the resumed run asks for the same call
again (same id) and the answer, posted to any worker, reaches it there. An answer and the
hand-over race at the runtime's waits (``AgentRunContext.cancel``): a run that took an answer
its checkpoint does not record yet is not handed over while it waits (it goes on here, within
the drain's budget); a run being handed over takes no answer, and the answer posted here
meanwhile gets 503 ``draining`` (post it again: another worker resumes the run with it).

A fenced-off run with a checkpoint is let go the same way, without the mark: the worker that
takes its lease resumes it (``reason: worker_lost``). A run that cannot be parked (resume
off, no checkpoint yet, not in the runtime) is cancelled with reason ``shutdown`` as before.
"""

from __future__ import annotations

import logging

from agent_runtime.events import AgentPhase
from app.runs.context import RunContext
from app.runs.handle import HANDOVER, RunHandle, now
from app.storage import StaleFence

__all__ = ["HandOver"]

logger = logging.getLogger("app.runs")

SHUTDOWN = "shutdown"


class HandOver:
    """Parks this worker's runs so that another worker (or the restart) resumes them."""

    def __init__(self, context: RunContext) -> None:
        self._context = context

    def can_park(self, handle: RunHandle) -> bool:
        """True if the run can be handed over: hand-over on, in the runtime, checkpointed."""
        context = self._context
        return (
            context.hand_over
            and handle.in_runtime
            and handle.checkpoint_step is not None
            and not (handle.done or handle.finalizing or handle.fenced)
        )

    def park_waiting(self) -> int:
        """Park every run waiting for an external answer; how many were asked to."""
        context = self._context
        count = 0
        for handle in list(context.runs.values()):
            run = context.agent_for(handle).active_runs.get(handle.run_id)
            if run is not None and run.phase is AgentPhase.WAITING and self.stop(handle):
                count += 1
        if count:
            logger.info("handing over waiting runs", extra={"runs": count})
        return count

    def stop(self, handle: RunHandle, *, streaming: bool = False) -> bool:
        """Stop the run here to be resumed elsewhere; False if it cannot be handed over.

        A ``streaming`` run is handed over only with a shared bus: its readers go on reading
        on another worker; with the in-process bus they are on this process, and a resume
        after the restart would go unseen, so it is cancelled (``shutdown``) instead.
        """
        if not self.can_park(handle) or (streaming and not self._context.bus.shared):
            return False
        agent = self._context.agent_for(handle)
        if handle.cancel_reason is None:
            handle.cancel_reason = HANDOVER
        elif handle.cancel_reason != HANDOVER:
            return False
        if agent.cancel_run(handle.run_id, HANDOVER):
            return True
        # refused: the run took an answer its checkpoint does not hold yet, and goes on here
        # (a waiting run then counts as streaming: the drain's budget, then hand-over)
        handle.cancel_reason = None
        return False

    async def park(self, handle: RunHandle) -> bool:
        """End the run here without ending it: its checkpoint marked handed over (unless it
        was fenced off), its hold released, no terminal event. False if the store refused
        (the caller ends the run as usual)."""
        context = self._context
        run_id = handle.run_id
        if not handle.fenced:
            try:
                parked = await context.store.park_checkpoint(
                    run_id, fence=handle.lease.token, reason=SHUTDOWN
                )
            except StaleFence:
                parked = False
            except Exception:
                logger.warning("could not park a run", exc_info=True, extra={"run_id": run_id})
                parked = False
            if not parked:
                return False
        handle.ticket.release()
        if handle.budget is not None:
            await handle.budget.settle(handle.spent_here())
        handle.finished_at = now()
        try:
            await context.bus.locks.release(handle.lease)
            await context.bus.router.unregister(run_id)
        except Exception:
            logger.warning("could not release a parked run's lease", extra={"run_id": run_id})
        context.forget(run_id)
        context.metrics.runs_parked.inc()
        handle.finish()
        logger.info(
            "run handed over",
            extra={"run_id": run_id, "events": handle.seq, "step": handle.checkpoint_step},
        )
        return True
