"""The session leases of this worker's runs: renewed while the runs go on (shared bus only).

Three background tasks:

- renewals: every ``lease_ttl / 4`` the held runs' leases are renewed (for ``lease_ttl``), all
  in one call; a renewal Redis confirmed moves the run's deadline on (``app.runs.fencing``).
  After a failed round the next comes after ``lease_ttl / 20`` instead, until one succeeds: a
  worker that loses Redis keeps trying, faster, and never gives its runs up on its own. A
  lease found taken over fences its run off at once.
- the watchdog: wakes at the nearest deadline and fences off every run past it, whatever the
  renewals are doing (a renewal stuck on an unreachable Redis does not delay it).
- the lost-run sweep (``app.runs.sweep``), every ``lease_ttl / 4``, for other workers' runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Coroutine
from typing import Any

from app.bus.base import BusUnavailable
from app.runs.context import RunContext
from app.runs.fencing import Fencing
from app.runs.handle import RunHandle
from app.runs.sweep import LostRunSweep
from app.storage import StorageUnavailable
from app.tasks import stop_tasks

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("app.runs")

# the longest the watchdog sleeps without looking again (new runs, renewals)
_WATCH_MAX = 1.0


class LeaseKeeper:
    """Renews this worker's leases, fences off the runs past their deadline, runs the sweep."""

    def __init__(self, context: RunContext, fencing: Fencing, sweep: LostRunSweep) -> None:
        self._context = context
        self._fencing = fencing
        self._sweep = sweep
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = False

    def start(self) -> None:
        """Start the background tasks (once)."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        coroutines: list[tuple[str, Coroutine[Any, Any, None]]] = [
            ("lease-renewals", self._renewals()),
            ("lease-watchdog", self._watch()),
            ("lost-run-sweep", self._sweeps()),
        ]
        self._tasks = [loop.create_task(c, name=name) for name, c in coroutines]

    async def aclose(self) -> None:
        """Stop the background tasks."""
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks)

    @property
    def interval(self) -> float:
        """Seconds between two rounds of renewals while they succeed."""
        return self._context.lease_ttl / 4

    @property
    def retry_interval(self) -> float:
        """Seconds between two rounds of renewals after one failed."""
        return self._context.lease_ttl / 20

    async def _renewals(self) -> None:
        ok = True
        while True:
            await asyncio.sleep(self.interval if ok else self.retry_interval)
            ok = await self.renew()

    async def _watch(self) -> None:
        fencing = self._fencing
        clock = self._context.clock
        while True:
            earliest = fencing.earliest()
            delay = _WATCH_MAX if math.isinf(earliest) else earliest - clock()
            await asyncio.sleep(min(max(delay, 0.0), _WATCH_MAX))
            fencing.enforce()

    async def _sweeps(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self.interval)
            rounds += 1
            try:
                await self._sweep.reap_lost_runs(from_store=rounds % 6 == 0)
            except (BusUnavailable, StorageUnavailable) as exc:  # an outage: no traceback
                logger.warning("could not check for lost runs: %s", exc)
            except Exception:
                logger.warning("could not check for lost runs", exc_info=True)

    async def renew(self) -> bool:
        """One round of renewals of the leases of this worker's unfinished runs, all in one
        call (``SessionLocks.renew_many``); False if they could not be confirmed (the next
        round comes sooner)."""
        handles = [
            h for h in self._context.runs.values() if not (h.done or h.finalizing or h.fenced)
        ]
        if not handles:
            return True
        ok = await self._renew(handles)
        if ok and self._failing:
            logger.info("session leases renewed again")
        self._failing = not ok
        return ok

    async def _renew(self, handles: list[RunHandle]) -> bool:
        context = self._context
        sent = context.clock()
        try:
            # bounded by the round's own pace: a renewal stuck on an unreachable Redis must
            # not hold back the next try (the watchdog does not wait for it either way)
            async with asyncio.timeout(self.interval):
                renewed = await context.bus.locks.renew_many(
                    [handle.lease for handle in handles], context.lease_ttl
                )
        except Exception as exc:
            context.metrics.lease_renewals_failed.inc(len(handles))
            remaining = min(handle.lease_deadline for handle in handles) - context.clock()
            log = logger.warning if self._failing else logger.error
            log(
                "could not renew %d session lease(s) (%.1f s left before the first run is "
                "fenced off): %s",
                len(handles),
                max(remaining, 0.0),
                exc if str(exc) else type(exc).__name__,
                extra={"run_id": handles[0].run_id} if len(handles) == 1 else None,
            )
            return False
        for handle, held in zip(handles, renewed, strict=True):
            if held:
                self._fencing.confirmed(handle, sent)
            else:
                context.metrics.lease_renewals_failed.inc()
                self._fencing.fence_off(handle, "its session lease was taken over")
        return True
