"""Stopping a run held here: through the runtime once the run is inside it, else by its task.

The first reason given wins. Routing (a cancel arriving from the bus or a request), fencing, the
disconnect grace, the drain and the start's own disconnect handling all stop runs through this.
"""

from __future__ import annotations

from agent_runtime.events import AgentPhase
from app.runs.context import RunContext
from app.runs.handle import HANDOVER, RunHandle

__all__ = ["RunStopper"]

# the runtime's phases after which a cancel changes nothing
_DECIDED = frozenset({AgentPhase.COMPLETED, AgentPhase.FAILED})


class RunStopper:
    """Cancels and stops the runs this worker holds."""

    def __init__(self, context: RunContext) -> None:
        self._context = context

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held here; False if there is no such unfinished run (or it is past
        its lease: this worker no longer speaks for it, see ``app.runs.fencing``)."""
        context = self._context
        handle = context.runs.get(run_id)
        if handle is None or handle.done or context.lapsed(handle):
            return False
        if handle.cancel_reason == HANDOVER:
            return False  # parked for another worker: the cancel is for whoever takes it
        return self.stop(handle, reason)

    def stop(self, handle: RunHandle, reason: str) -> bool:
        """Stop a run held here, for ``reason`` (the first one given wins). False if its
        outcome was already decided otherwise: it ends as it was going to (so a cancel
        answered 202 ``cancelling`` does end ``run.cancelled``)."""
        run_id = handle.run_id
        if handle.finalizing:  # its terminal event is being written: too late to change it
            return False
        if handle.in_runtime:
            agent = self._context.agent_for(handle)
            run = agent.active_runs.get(run_id)
            if run is None or run.phase in _DECIDED:
                return False  # the runtime's run has ended: its terminal event is on its way
            if handle.cancel_reason is None:
                handle.cancel_reason = reason
            return agent.cancel_run(run_id, handle.cancel_reason)
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
        task = handle.task
        if task is None:  # still in start(): queued, or storing its record
            handle.ticket.abort()
            return True
        if not handle.task_cancelled:
            handle.task_cancelled = True
            task.cancel()
        return True
