"""Cancels that no worker could take when they were asked: kept where the run's next owner
reads them.

A cancel normally reaches the worker holding the run (``Router.cancel``). Between owners
(its worker died and no other has taken its lease yet, or it was parked at a shutdown) there
is nobody to tell, and a ``202 cancelling`` must still end in ``run.cancelled``. So the cancel
is written as a mark beside the run (a shared value with the bus's lifetime), and:

- the worker that resumes the run reads the mark once it holds the lease and has routed the
  run to itself, and ends the run cancelled instead of going on (``app.runs.resume``);
- the sweep, ending a run it cannot resume, ends it cancelled rather than ``worker_lost``
  (``app.runs.sweep``).

The order makes the mark safe against a resume in flight: the canceller writes the mark, then
asks the run's route again; the resumer routes the run to itself, then reads the mark. One of
the two always sees the other.
"""

from __future__ import annotations

from app.bus.base import SharedValues

__all__ = ["CancelMarks"]

# a run between owners is taken within its lease; one parked at a deploy may wait for the
# next worker to start: the mark outlives both by far
_MIN_TTL = 600.0


class CancelMarks:
    """The cancels marked on runs that no worker held when they were asked."""

    def __init__(self, values: SharedValues, lease_seconds: float) -> None:
        self._values = values
        self._ttl = max(_MIN_TTL, 10 * lease_seconds)

    async def mark(self, run_id: str, reason: str) -> None:
        """Keep ``reason`` for whoever takes the run next (the first reason stays)."""
        await self._values.put_new(_key(run_id), reason, self._ttl)

    async def reason(self, run_id: str) -> str | None:
        """The reason a cancel was marked on the run with, or None."""
        return await self._values.get(_key(run_id))


def _key(run_id: str) -> str:
    return f"cancel:{run_id}"
