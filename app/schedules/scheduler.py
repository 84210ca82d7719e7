"""The scheduler: one task per worker that fires the due times of every schedule, once.

No worker leads. Each one, every ``AGENT_SCHEDULER_POLL_INTERVAL``::

    tick()
      take over: firings whose lease ended (their worker died; or refused, and their
                 Retry-After passed) → one worker wins each (the token is raised) → fire
      claim:     due schedules → compare-and-set of (next_due_at, fired_count) → the
                 winner records the firing (leased to it) and fires it; the others lose

Firing starts a background run through the run manager, so through the same admission,
budgets and session lock as ``POST /v1/sessions/{id}/runs``. A refusal that says when to try
again (429, 503, a busy session) is recorded as ``retrying`` with ``lease_until`` at that
time; any worker takes it over then. The run carries ``schedule_id`` and ``scheduled_for``
in its metadata. The run's record is created in the same store transaction that moves the
firing, at its holder's token, to ``started`` (``FiringFence``): a worker that stalled past
its lease while another took the firing over (raising the token) finds its start refused
(``FiringLost``) before the run calls anything, so each due time has one run however long a
holder pauses. A firing taken over first looks for a run of it too (stored by an older
version that settled the firing after the start).

A due time found more than ``AGENT_SCHEDULER_MISFIRE_GRACE`` late (nobody ran meanwhile)
follows the schedule's ``misfire``: ``skip`` records one ``skipped`` firing for the latest
missed time and moves on; ``run_once`` fires once, for the latest missed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Final

from app.bus.base import BusError
from app.errors import ServiceError
from app.runs.handle import RunRequestOptions
from app.schedules.timing import Timing
from app.storage import StorageError, Store
from app.storage.base import utcnow
from app.storage.schedules import FiringFence, FiringLost, FiringRecord, ScheduleRecord

__all__ = ["RETRYABLE_CODES", "Scheduler", "StartRun", "firing_session"]

logger = logging.getLogger("app.schedules")

StartRun = Callable[[str, str, RunRequestOptions], Awaitable[str]]
"""Start a background run: (principal, session id, options) → its run id; raises the run
manager's ``ServiceError`` when refused."""

RETRYABLE_CODES: Final = frozenset(
    {
        "overloaded",
        "draining",
        "session_busy",
        "agent_unavailable",
        "budget_exceeded",
        "unavailable",
    }
)
_DEFAULT_RETRY: Final = 1.0
_BATCH: Final = 100
# how many of a session's latest runs a takeover looks through for its predecessor's run
_RUNS_SEARCHED: Final = 50


def firing_session(schedule_id: str, due_at: datetime) -> str:
    """The new session of one firing of a schedule without a session: one per due time,
    named for it, so a retried firing reuses it."""
    return f"{schedule_id}.{int(due_at.timestamp())}"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class Scheduler:
    """This worker's share of the scheduling; ``start()`` it, ``aclose()`` it."""

    def __init__(
        self,
        store: Store,
        start_run: StartRun,
        *,
        poll_interval: float = 1.0,
        lease_seconds: float = 30.0,
        misfire_grace: float = 60.0,
        max_attempts: int = 20,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._start_run = start_run
        self._poll = poll_interval
        self._lease = timedelta(seconds=lease_seconds)
        self._grace = timedelta(seconds=misfire_grace)
        self._max_attempts = max_attempts
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Start polling on the running loop (idempotent)."""
        if self._task is None and not self._stopping.is_set():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="scheduler")

    async def aclose(self) -> None:
        """Stop polling, after the firing being started (a start is short: its runs are
        background ones); cancelled meanwhile, it stops at once. Idempotent."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait([task])
        except BaseException:
            # cut short: a firing cut off keeps its lease, and another worker takes it over
            task.cancel()
            raise

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.tick()
            except (StorageError, BusError) as exc:
                logger.warning("scheduler tick failed; retrying", extra={"error": str(exc)})
            except Exception:
                logger.exception("scheduler tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._poll)

    async def tick(self) -> int:
        """One pass: take over what is due to be, claim what is due; how many it fired."""
        now = self._clock()
        fired = 0
        for firing in await self._store.reclaim_firings(now, now + self._lease, _BATCH):
            if self._stopping.is_set():
                break  # taken over, not fired: its new lease runs out for another worker
            fired += await self._fire(firing, None)
        for schedule in await self._store.due_schedules(now, _BATCH):
            if self._stopping.is_set():
                break
            fired += await self._claim(schedule, now)
        return fired

    async def _claim(self, schedule: ScheduleRecord, now: datetime) -> int:
        due = schedule.next_due_at
        assert due is not None  # due_schedules returns scheduled ones only
        timing = Timing(schedule.cron, schedule.at, schedule.timezone, schedule.end_at)
        missed = 0
        skipped = False
        late = now - due > self._grace
        if late:
            count, due = timing.missed_between(due, now)
            skipped = schedule.misfire == "skip"
            missed = count if skipped else count - 1
        # a late one moves on past now (even beyond the times ``missed_between`` counted)
        following = timing.next_after(now if late else due)
        fired = schedule.fired_count + (not skipped)
        if schedule.end_count is not None and fired >= schedule.end_count:
            following = None
        firing = FiringRecord(
            schedule_id=schedule.id,
            due_at=due,
            status="skipped" if skipped else "claimed",
            token=1,
            lease_until=now + self._lease,
            missed=missed,
        )
        if not await self._store.claim_due(schedule, following, firing):
            return 0  # another worker claimed this due time (or the schedule changed)
        if firing.status == "skipped":
            logger.info(
                "missed firings skipped",
                extra={"schedule_id": schedule.id, "due_at": _iso(due), "missed": missed},
            )
            return 0
        return await self._fire(firing, schedule)

    async def _fire(self, firing: FiringRecord, schedule: ScheduleRecord | None) -> int:
        """Start the run of a firing this worker holds, and record what came of it."""
        store = self._store
        if schedule is None:
            schedule = await store.get_schedule(firing.schedule_id)
            if schedule is None:
                return 0  # deleted meanwhile (with its firings)
        session_id = schedule.session_id or firing_session(schedule.id, firing.due_at)
        scheduled_for = _iso(firing.due_at)
        if firing.token > 1:
            earlier = await self._run_of(session_id, schedule.id, scheduled_for)
            if earlier is not None:  # the previous holder started it, then died
                await store.settle_firing(firing, status="started", run_id=earlier)
                return 0
        options = RunRequestOptions(
            input=schedule.input,
            agent=schedule.agent,
            background=True,
            metadata={"schedule_id": schedule.id, "scheduled_for": scheduled_for},
            firing=FiringFence(firing.schedule_id, firing.due_at, firing.token),
        )
        try:
            # its record settles the firing as started, in one transaction (see above)
            run_id = await self._start_run(schedule.principal, session_id, options)
        except ServiceError as exc:
            await self._refused(firing, exc)
            return 0
        except FiringLost:
            logger.warning(
                "a firing's lease ran out before its run was started; another worker has it",
                extra={"schedule_id": schedule.id, "due_at": scheduled_for, "token": firing.token},
            )
            return 0
        logger.info(
            "scheduled run started",
            extra={"schedule_id": schedule.id, "due_at": scheduled_for, "run_id": run_id},
        )
        return 1

    async def _refused(self, firing: FiringRecord, exc: ServiceError) -> None:
        detail = f"{exc.code}: {exc.detail}"
        if exc.code in RETRYABLE_CODES and firing.attempts + 1 < self._max_attempts:
            wait = exc.retry_after if exc.retry_after is not None else _DEFAULT_RETRY
            retry_at = self._clock() + timedelta(seconds=max(wait, 0.0))
            await self._store.settle_firing(
                firing, status="retrying", detail=detail, lease_until=retry_at
            )
            logger.info(
                "scheduled run refused; retrying",
                extra={"schedule_id": firing.schedule_id, "code": exc.code, "retry_in": wait},
            )
            return
        await self._store.settle_firing(firing, status="failed", detail=detail)
        logger.warning(
            "scheduled run refused",
            extra={"schedule_id": firing.schedule_id, "code": exc.code},
        )

    async def _run_of(self, session_id: str, schedule_id: str, scheduled_for: str) -> str | None:
        """The run an earlier holder of the firing started, if it got that far."""
        for run in await self._store.list_runs(session_id, _RUNS_SEARCHED):
            metadata = run.metadata
            if (
                metadata.get("schedule_id") == schedule_id
                and metadata.get("scheduled_for") == scheduled_for
            ):
                return run.run_id
        return None
