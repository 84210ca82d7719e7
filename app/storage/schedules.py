"""What the store keeps of scheduled runs: schedules, and the firings of their due times.

A firing is claimed once per (schedule, due time) by a compare-and-set on the schedule row
(``claim_due``: its ``next_due_at`` and ``fired_count`` as read), which inserts the firing in
the same transaction: of any number of workers that read the same due time, one wins. The
winner holds the firing's lease (``lease_until``) and its fencing token; a firing whose lease
ran out (its worker died, or it waits to retry after a refusal) is taken over by exactly one
worker (``reclaim_firings`` raises the token), and only the holder of the current token can
settle it (``settle_firing``). The run of a firing is created under the same proof: its record
is inserted only in the transaction that moves the firing, at that token, from ``claimed`` to
``started`` (``Store.create_run(run, firing=...)``), so a worker that stalled past its lease
while another took the firing over starts nothing (``FiringLost``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal, get_args

from app.storage.common import JSONObject, StorageError, require_aware, utcnow

__all__ = [
    "FIRING_STATUSES",
    "OPEN_FIRING_STATUSES",
    "FiringFence",
    "FiringLost",
    "FiringRecord",
    "FiringStatus",
    "Misfire",
    "ScheduleRecord",
]

Misfire = Literal["skip", "run_once"]
FiringStatus = Literal["claimed", "retrying", "started", "skipped", "failed"]
"""``claimed``: a worker is starting its run; ``retrying``: refused, tried again at
``lease_until``; ``started``: its run was admitted (``run_id``); ``skipped``: missed while no
worker ran (``misfire: skip``); ``failed``: refused for good (``detail``)."""

FIRING_STATUSES: Final[frozenset[str]] = frozenset(get_args(FiringStatus))
OPEN_FIRING_STATUSES: Final[tuple[FiringStatus, ...]] = ("claimed", "retrying")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRecord:
    """A principal's schedule: what to run, when, and where it stands.

    ``next_due_at`` is None once it ended (its one time fired, its count or date reached).
    ``session_id`` None: each firing runs in a new session.
    """

    id: str
    principal: str
    agent: str
    input: str
    cron: str | None
    at: datetime | None
    timezone: str
    session_id: str | None
    end_count: int | None
    end_at: datetime | None
    misfire: Misfire
    paused: bool
    next_due_at: datetime | None
    fired_count: int = 0
    metadata: JSONObject = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        for name in ("at", "end_at", "next_due_at", "created_at", "updated_at"):
            require_aware(name, getattr(self, name))


@dataclass(frozen=True, slots=True, kw_only=True)
class FiringRecord:
    """One due time of a schedule and what came of it."""

    schedule_id: str
    due_at: datetime
    status: FiringStatus
    token: int
    lease_until: datetime
    run_id: str | None = None
    attempts: int = 0
    detail: str | None = None
    missed: int = 0
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.status not in FIRING_STATUSES:
            raise ValueError(f"unknown firing status {self.status!r}")
        for name in ("due_at", "lease_until", "created_at", "updated_at"):
            require_aware(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class FiringFence:
    """The firing a run is started for, and the token its starter holds it with."""

    schedule_id: str
    due_at: datetime
    token: int


class FiringLost(StorageError):
    """A firing's run was not created: the firing is no longer held with that token (another
    worker took it over after the lease ran out), or it was settled or deleted meanwhile."""

    def __init__(self, fence: FiringFence) -> None:
        super().__init__(
            f"the firing of schedule {fence.schedule_id!r} due {fence.due_at.isoformat()} is "
            f"no longer held with token {fence.token}; its run was not created"
        )
        self.fence = fence
