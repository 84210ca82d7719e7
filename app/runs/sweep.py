"""Runs no worker holds any more: the lost-run sweep (shared bus), and recovery at start (one
worker, no shared bus).

A worker that dies stops renewing its leases; once one lapses, any worker's sweep takes the
session's lock (a higher fencing token than the lost worker's) and gives the run one end, the
same in its log and in the store (``settle``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from app.admission.slots import AdmissionRejected
from app.bus.base import BusError, LogNotFound, WireEvent
from app.bus.wire import WireEncoder
from app.runs.context import RunContext
from app.runs.handle import RunHandle
from app.runs.resume import Resumer
from app.storage import RunRecord, RunStatus, WebhookMessage

__all__ = ["LostRunSweep"]

logger = logging.getLogger("app.runs")

# how often runs found at start with no slot to resume in are tried again
_RETRY_SECONDS = 1.0
# candidates of one sweep round looked at (resumed or ended) at once
_SWEEP_CONCURRENCY = 16
_STATUS_OF_END: dict[str, RunStatus] = {"run.completed": "completed", "run.failed": "failed"}


class LostRunSweep:
    """Ends the runs whose worker is gone."""

    def __init__(self, context: RunContext, resumer: Resumer | None = None) -> None:
        self._context = context
        self._resumer = resumer
        self._retry: asyncio.Task[None] | None = None
        # runs being resumed here now: the sweep and an answer or a cancel can reach the same
        # run at once, and both would take the run's (re-entrant) lease and resume it twice
        self._resuming: set[str] = set()

    async def recover(self) -> int:
        """Resume, or else fail, the runs a previous process left unfinished (one worker, no
        shared bus only); how many were failed."""
        context = self._context
        store = context.store
        count = 0
        deferred: list[tuple[str, str]] = []
        for record in await store.list_unfinished_runs():
            if record.run_id in context.runs:
                continue
            if await self._resume(record.run_id, record.session_id):
                if record.run_id not in context.runs:
                    deferred.append((record.run_id, record.session_id))  # no slot yet
                continue
            error = {
                "code": "worker_lost",
                "message": "the server stopped before this run finished",
            }
            await self._store_end(record, "failed", "run.failed", {"error": error})
            count += 1
        if count:
            logger.warning("marked runs of a previous process as lost", extra={"count": count})
        if deferred:
            # more runs to resume than slots: each waits for one (nobody else will take them)
            logger.info("runs wait for a slot to resume", extra={"count": len(deferred)})
            self._retry = asyncio.get_running_loop().create_task(
                self._resume_later(deferred), name="resume-deferred"
            )
        return count

    async def _resume_later(self, deferred: list[tuple[str, str]]) -> None:
        """Resume the runs ``recover`` found no slot for, as slots free up."""
        context = self._context
        while deferred and not context.draining:
            await asyncio.sleep(_RETRY_SECONDS)
            waiting = []
            for run_id, session_id in deferred:
                if run_id in context.runs:
                    continue
                try:
                    resumed = await self._resume(run_id, session_id)
                except Exception:
                    logger.warning("could not resume a run", exc_info=True)
                    resumed = True
                if resumed and run_id not in context.runs:
                    waiting.append((run_id, session_id))
            deferred = waiting

    async def aclose(self) -> None:
        """Stop resuming deferred runs."""
        task, self._retry = self._retry, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def reap_lost_runs(self, *, from_store: bool = True) -> int:
        """End the runs whose worker no longer holds their session's lease.

        Candidates: unsealed logs whose run no worker holds (on a bus that lists them, every
        round) and the store's unfinished runs (``from_store``). For each, take the session's
        lock (a higher fencing token than the lost worker's), then make the log and the store
        agree on one end (``settle``). Returns how many runs were failed as ``worker_lost``.
        Only meaningful with a shared bus, where leases expire when a worker dies.
        """
        context = self._context
        runs = context.runs
        candidates: dict[str, str] = {}
        # this worker's runs while the candidates are listed: listed as unfinished, they were
        # running here, so they are not lost (each ends through its finalize, here). Skipping
        # them without a look keeps a round cheap where most runs are local, and a run of ours
        # that ended since does not cost its reads (a later round still sees a record left
        # unfinished, by a store outage, once the run is no longer ours)
        ours = set(runs)
        orphans = getattr(context.events, "orphans", None)
        if callable(orphans):
            candidates.update(await orphans())
        if from_store:
            for record in await context.store.list_unfinished_runs():
                candidates.setdefault(record.run_id, record.session_id)
        ours.update(runs)
        todo = [(r, s) for r, s in candidates.items() if r not in ours and r not in runs]
        if not todo:
            return 0
        # a few at a time: after a deploy a worker takes over hundreds of parked runs, each a
        # handful of round trips to the store and the bus, most of it waiting
        gate = asyncio.Semaphore(_SWEEP_CONCURRENCY)

        async def one(run_id: str, session_id: str) -> bool:
            async with gate:
                return await self._reap(run_id, session_id)

        outcomes = await asyncio.gather(*(one(r, s) for r, s in todo), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]
        return sum(1 for o in outcomes if o is True)

    async def _reap(self, run_id: str, session_id: str) -> bool:
        """Resume, or else end, one candidate of the sweep; True if it was failed as lost."""
        context = self._context
        locks = context.bus.locks
        if run_id in context.runs:
            return False
        if await locks.holder(session_id) == run_id:
            return False  # its worker still renews the lease
        if await self._ended(run_id):
            # it ended where it ran since the candidates were listed (its lock released
            # after both of these): taking the lock now would only make a client's next
            # run in the session find it busy
            return False
        if await self._resume(run_id, session_id):
            return False
        reaper = f"reaper_{secrets.token_hex(8)}"
        lease = await locks.acquire(session_id, reaper, context.lease_ttl)
        if lease is None:
            return False  # the session is busy again; a later round decides
        try:
            return await self.settle(run_id, session_id, lease.token)
        finally:
            await locks.release(lease)

    async def resume_parked(self, run_id: str, session_id: str) -> RunHandle | None:
        """Resume here a run no worker holds (an answer or a cancel came for it); its handle,
        or None. ``session_id`` must be the run's own: callers resolve the run with its owner
        and session first (``RunContext.find``), and a run is only ever resumed under a lease
        on its own session (``_resume`` reads the session from the run's record)."""
        if run_id in self._context.runs:
            return None  # still held here: until this worker lets it go, nobody resumes it
        if await self._context.bus.locks.holder(session_id) is not None:
            return None  # held: by its worker, or by another that resumes it now
        if self._context.draining or not await self._resume(run_id, session_id):
            return None
        return self._context.runs.get(run_id)

    async def _resume(self, run_id: str, session_id: str) -> bool:
        """Resume the run here from its checkpoint if it can be (``app.runs.resume``): the
        session's lock taken for the run itself; True if it now goes on here (or is being
        resumed here by another caller)."""
        if run_id in self._resuming or run_id in self._context.runs:
            return True
        self._resuming.add(run_id)
        try:
            return await self._resume_once(run_id, session_id)
        finally:
            self._resuming.discard(run_id)

    async def _resume_once(self, run_id: str, session_id: str) -> bool:
        resumer = self._resumer
        if resumer is None:
            return False
        found = await resumer.resumable(run_id)
        if found is None:
            return False
        if found[0].session_id != session_id:
            # never under another session's lease: that would let the run's own session
            # start a second run beside it, and fence off the worker that holds it
            logger.error("not resuming a run under another session", extra={"run_id": run_id})
            return False
        _, end = await self._log_end(run_id)
        if end is not None:
            return False  # it ended; settle() makes the store agree
        context = self._context
        if context.draining:
            return True  # resumable, but not here: this worker is stopping (another resumes it)
        sent = context.clock()
        # exclusive: another worker that resumed the run meanwhile holds a lease for the same
        # holder (the run's id); handed that lease, this worker would release it on failing
        # to take the checkpoint over, and the run would be fenced off where it goes on
        lease = await context.bus.locks.acquire(
            session_id, run_id, context.lease_ttl, exclusive=True
        )
        if lease is None:
            return True  # taken by another worker meanwhile (or the session is busy): theirs
        lease = await resumer.past_checkpoint(lease, run_id)
        try:
            if await resumer.resume(found[0], lease, sent):
                return True
        except AdmissionRejected as exc:
            # no slot here now: the run stays resumable, for another worker or a later round
            await context.bus.locks.release(lease)
            logger.info("not resuming a run here now: %s", exc, extra={"run_id": run_id})
            return True
        except BaseException:
            await context.bus.locks.release(lease)
            raise
        await context.bus.locks.release(lease)
        return False

    async def _ended(self, run_id: str) -> bool:
        """True if nothing is left to settle: the run's record (if any) is finished and its log
        (if any is left) holds its end."""
        record = await self._context.store.get_run(run_id)
        if record is not None and not record.is_finished:
            return False
        kept, end = await self._log_end(run_id)
        # no log left (expired, even while it was being read, or never made): nothing to end
        return not kept or end is not None

    async def settle(self, run_id: str, session_id: str, fence: int) -> bool:
        """Give a run that no worker holds one end, the same in its log and in the store.

        Lost mid-way: ``run.failed`` (``worker_lost``) in both, so its readers get their
        terminal event. Its worker died between storing the end and appending it: that end
        is appended; the reverse (the store was unreachable): the logged end is stored. True
        if the run was failed as lost.
        """
        record = await self._context.store.get_run(run_id)
        _, logged = await self._log_end(run_id)
        if logged is not None:
            if record is not None and not record.is_finished:
                status = _STATUS_OF_END.get(logged.type, "cancelled")
                await self._store_end(record, status, logged.type, logged.document["data"], fence)
            return False
        if record is not None and record.is_finished:
            if record.status == "completed":
                completed = {"output": record.output, "usage": record.usage or {}}
                await self._append_end(run_id, session_id, "run.completed", completed, fence)
            elif record.status == "failed":
                await self._append_end(
                    run_id, session_id, "run.failed", {"error": record.error}, fence
                )
            else:  # the reason of a cancellation is not stored
                await self._append_end(
                    run_id, session_id, "run.cancelled", {"reason": "shutdown"}, fence
                )
            return False
        cancelled = await self._context.cancel_marks.reason(run_id)
        if cancelled is not None:
            # a cancel was answered 202 while the run was between owners: it ends cancelled
            if record is not None:
                await self._store_end(
                    record, "cancelled", "run.cancelled", {"reason": cancelled}, fence
                )
            await self._append_end(
                run_id, session_id, "run.cancelled", {"reason": cancelled}, fence
            )
            return False
        error = {
            "code": "worker_lost",
            "message": "the worker running this run stopped before it finished",
        }
        # stored first: a reader that gets the terminal event finds the run ended
        if record is not None:
            await self._store_end(record, "failed", "run.failed", {"error": error}, fence)
        await self._append_end(run_id, session_id, "run.failed", {"error": error}, fence)
        logger.warning("run lost with its worker", extra={"run_id": run_id})
        return True

    async def _store_end(
        self,
        record: RunRecord,
        status: RunStatus,
        event_type: str,
        data: dict[str, Any],
        fence: int | None = None,
    ) -> None:
        """Store the end of a run its worker did not, with the notification of its end (the
        worker would have sent it in the same write; a worker that stored its end after all
        sent the same message, under the same id)."""
        context = self._context
        webhooks = context.webhooks
        webhook: WebhookMessage | None = None
        if webhooks is not None and record.webhook_url is not None:
            webhook = webhooks.end(
                record.webhook_url,
                run_id=record.run_id,
                session_id=record.session_id,
                agent=record.agent,
                status=status,
                event_type=event_type,
                data=data,
            )
        await context.store.update_run(
            record.run_id,
            status=status,
            output=data.get("output") if status == "completed" else None,
            usage=data.get("usage") if status == "completed" else None,
            error=data.get("error") if status == "failed" else None,
            fence=fence,
            webhook=webhook,
        )
        if webhook is not None and webhooks is not None:
            webhooks.wake()

    async def _log_end(self, run_id: str) -> tuple[bool, WireEvent | None]:
        """Whether the run's log is still kept, and its terminal event if it has one.

        A sealed log expires its TTL after the run's end, possibly between two of these reads:
        a log found gone at any of them counts as not kept, never as one without an end.
        """
        events = self._context.events
        last = await events.last_seq(run_id)
        if last is None:
            return False, None
        if last == 0:
            return True, None
        try:
            subscription = await events.subscribe(run_id, after=last - 1)
        except LogNotFound:
            return False, None
        try:
            async with asyncio.timeout(10):
                batch = await subscription.next()
        finally:
            await subscription.aclose()
        if batch and batch[-1].terminal:
            return True, batch[-1]
        return True, None

    async def _append_end(
        self, run_id: str, session_id: str, type_: str, data: dict[str, Any], fence: int
    ) -> None:
        events = self._context.events
        last = await events.last_seq(run_id)
        if last is None:
            return  # no log (never created, or expired): the store alone tells
        wire = WireEncoder(run_id, session_id).encode(last + 1, type_, time.time(), data)
        try:
            await events.append(run_id, wire, fence=fence)
        except BusError:
            logger.warning("could not end a lost run's log", extra={"run_id": run_id})
