"""Fencing: each run's lease deadline on this worker's clock, and what happens when it passes.

A run's session lease lives in the shared bus (Redis) for ``lease_ttl`` seconds from its last
renewal; once it lapses, any worker's lost-run sweep may take the session over and end the
run. This worker cannot see that moment, only the renewals Redis confirmed. So each run knows
a deadline on the local monotonic clock::

    deadline = (when the last confirmed renewal was *sent*) + lease_ttl * (1 - FENCE_MARGIN)

Taking the time before the request, not at its answer, already covers the renewal's round
trip (Redis started the TTL after it was sent). ``FENCE_MARGIN`` (a tenth of the TTL: 1 s for
the default 15 s ``AGENT_LEASE_SECONDS``) covers what remains: the rate difference of this
host's clock and Redis's (well under 0.1% for any NTP-disciplined or free-running quartz
clock), and the lateness of the watchdog's own timer on a loaded event loop.

Before the deadline passes without a confirmed renewal the worker fences the run off
(``Fencing.fence_off``): the run is marked fenced, its streams are told (``fenced_off``), and
it is stopped locally. From then on this worker does nothing observable for it: no tool call
starts (the runtime's run is cancelled), no answer or cancel is taken for it, its events are
dropped, and it ends as ``failed``/``worker_lost``, the sweep's own verdict, written only
with its lease's fencing token, which the store and the event log refuse once anyone wrote
with a newer one. A tool call already running is counted (``agent_tool_calls_after_lease``)
and logged: it finishes, if at all, after the lease.

A run whose event log fails under it (Redis unreachable past the call's bound, its data
lost, the log taken over) is fenced off the same way, at that moment, since the worker can no
longer keep the run's log: it writes no end (no ``unavailable``, no ``internal``), and the
worker that next takes the lease resumes the run from its checkpoint. So is a run whose
renewal finds its lease gone (taken over, or lost with Redis's data): any worker may take
the session at once.

With the in-process bus (one worker) a lease cannot outlive its holder: the deadline is
infinite and nothing here applies.
"""

from __future__ import annotations

import logging
import math
from typing import Final

from app.runs.context import RunContext
from app.runs.handle import RunHandle
from app.runs.stopping import RunStopper

__all__ = ["FENCE_MARGIN", "Fencing"]

logger = logging.getLogger("app.runs")

FENCE_MARGIN: Final = 0.1
"""The part of the lease TTL a run gives up at the end of each confirmed renewal."""


class Fencing:
    """The lease deadlines of this worker's runs, and fencing runs off at them."""

    def __init__(self, context: RunContext, stopper: RunStopper) -> None:
        self._context = context
        self._stopper = stopper

    def deadline_after(self, sent_at: float) -> float:
        """The deadline a lease acquired or renewed by a request sent at ``sent_at`` gives."""
        context = self._context
        if not context.bus.shared:
            return math.inf
        return sent_at + context.lease_ttl * (1 - FENCE_MARGIN)

    def confirmed(self, handle: RunHandle, sent_at: float) -> None:
        """Redis confirmed a renewal of the run's lease sent at ``sent_at``."""
        if not handle.fenced:
            handle.lease_deadline = max(handle.lease_deadline, self.deadline_after(sent_at))

    def enforce(self) -> int:
        """Fence off every run whose deadline has passed; how many were."""
        now = self._context.clock()
        count = 0
        for handle in list(self._context.runs.values()):
            if not handle.fenced and not handle.done and now >= handle.lease_deadline:
                self.fence_off(handle, "its lease deadline passed without a confirmed renewal")
                count += 1
        return count

    def earliest(self) -> float:
        """The nearest deadline of a run not yet fenced off (infinite if none)."""
        return min(
            (h.lease_deadline for h in self._context.runs.values() if not h.fenced and not h.done),
            default=math.inf,
        )

    def fence_off(self, handle: RunHandle, why: str, *, stop: bool = True) -> None:
        """Stop acting for the run: see the module's docstring. Idempotent. ``stop=False``
        for a run that has stopped already (its driver is on its way to finalize)."""
        if handle.fenced or handle.done:
            return
        context = self._context
        handle.fence()
        context.metrics.runs_fenced.inc()
        running = len(handle.tools_running)
        details = {"run_id": handle.run_id, "session_id": handle.session_id}
        if running:
            context.metrics.tool_calls_after_lease.inc(running)
            logger.error(
                "%d tool call(s) of a fenced-off run are still running: they finish after the "
                "run's lease",
                running,
                extra=details,
            )
        logger.error("fenced off a run: %s; stopping it here", why, extra=details)
        if stop and not handle.finalizing:
            self._stopper.stop(handle, "shutdown")
