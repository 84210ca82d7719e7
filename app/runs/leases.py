"""The session leases of this worker's runs: renewed while the runs go on (shared bus only).

Every ``lease_seconds / 6`` the keeper renews each held run's lease (for ``lease_ttl``) and
then lets the lost-run sweep look for other workers' runs (``app.runs.sweep``). A lease found
taken over stops its run.
"""

from __future__ import annotations

import asyncio
import logging

from app.bus.base import BusUnavailable, LeaseLost
from app.runs.context import RunContext
from app.runs.routing import Routing
from app.runs.sweep import LostRunSweep
from app.storage import StorageUnavailable

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("app.runs")


class LeaseKeeper:
    """Renews this worker's leases and runs the sweep, in one background task."""

    def __init__(self, context: RunContext, routing: Routing, sweep: LostRunSweep) -> None:
        self._context = context
        self._routing = routing
        self._sweep = sweep
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the background task (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def aclose(self) -> None:
        """Stop the background task."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _maintain(self) -> None:
        """Renew this worker's leases, and fail other workers' lost runs."""
        interval = self._context.lease_seconds / 6
        rounds = 0
        while True:
            await asyncio.sleep(interval)
            await self.renew()
            rounds += 1
            try:
                await self._sweep.reap_lost_runs(from_store=rounds % 6 == 0)
            except (BusUnavailable, StorageUnavailable) as exc:  # an outage: no traceback
                logger.warning("could not check for lost runs: %s", exc)
            except Exception:
                logger.warning("could not check for lost runs", exc_info=True)

    async def renew(self) -> None:
        """One round of renewals of the leases of this worker's unfinished runs."""
        context = self._context
        for handle in list(context.runs.values()):
            if handle.done or handle.finalizing:
                continue
            try:
                await context.bus.locks.renew(handle.lease, context.lease_ttl)
            except LeaseLost:
                logger.error(
                    "lost the session lease of a run; stopping it", extra={"run_id": handle.run_id}
                )
                self._routing.cancel_local(handle.run_id, "shutdown")
            except Exception:
                logger.warning(
                    "could not renew a session lease",
                    exc_info=True,
                    extra={"run_id": handle.run_id},
                )
