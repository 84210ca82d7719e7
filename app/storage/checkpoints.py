"""What the store keeps of a run in progress: its last checkpoint (``run_checkpoints``).

One row per unfinished run that saved one: the runtime's checkpoint (``data``, the JSON of
``agent_runtime.RunCheckpoint``), the event log position it corresponds to (``event_seq``),
how many times the run was taken over (``resumes``) and, for a run parked by a worker that
shut down, ``handover`` (``"shutdown"``). Every write carries the fencing token of the
run's session lease and is refused (``StaleFence``) once the run or its checkpoint was
written with a newer one, in the same statement that writes: a worker fenced off cannot
record progress the worker that took the run over would then resume from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.storage.common import JSONObject, require_aware

__all__ = ["CheckpointRecord"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """A run's last stored checkpoint."""

    run_id: str
    session_id: str
    step: int
    """The runtime's checkpoint number (1, 2, 3 ... per run)."""
    event_seq: int
    """The seq of the run's last logged event when the checkpoint was taken."""
    data: JSONObject
    resumes: int = 0
    """How many times the run was taken over (resumed) so far."""
    handover: str | None = None
    """``shutdown`` once a draining worker parked the run; None otherwise."""
    fence: int = 0
    updated_at: datetime

    def __post_init__(self) -> None:
        require_aware("updated_at", self.updated_at)
