"""Resume instead of ``worker_lost``: a run whose worker died, was fenced off or shut down
goes on, on the worker that takes its lease, from its last checkpoint.

::

    the sweep (shared bus) or recovery at start (one worker): a run no worker holds
      resumable?  AGENT_RESUME_RUNS on, the run unfinished, a checkpoint stored, fewer than
                  AGENT_MAX_RESUMES resumes so far, its agent configured here
      take it:    the session's lock for the run (a newer fencing token) → the checkpoint
                  taken over with that token (resumes + 1; the lost worker's late writes
                  are refused from now on) → a handle → the log (kept; a new one from the
                  checkpoint's seq after a restart of the in-process bus, or a Redis that
                  lost its data) → the driver
      the driver: ``AgentCore.resume(checkpoint)``; its first event is logged as
                  ``run.resumed`` (``reason`` worker_lost|shutdown, ``from_seq``)

Anything else ends the way it did before: ``run.failed`` ``worker_lost`` (``app.runs.sweep``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from agent_runtime.checkpoints import RunCheckpoint
from agent_runtime.errors import CheckpointError
from app.bus.base import Lease
from app.runs.checkpoints import REQUEST_KEY, resumed_options
from app.runs.context import RunContext
from app.runs.driver import Driver
from app.runs.fencing import Fencing
from app.runs.grace import DisconnectGrace
from app.runs.handle import RunHandle
from app.storage import CheckpointRecord, RunRecord, StaleFence

__all__ = ["Resumer"]

logger = logging.getLogger("app.runs")


class Resumer:
    """Takes over runs no worker holds, from their checkpoints."""

    def __init__(
        self,
        context: RunContext,
        driver: Driver,
        fencing: Fencing,
        grace: DisconnectGrace | None = None,
    ) -> None:
        self._context = context
        self._driver = driver
        self._fencing = fencing
        self._grace = grace

    async def resumable(self, run_id: str) -> tuple[RunRecord, CheckpointRecord] | None:
        """The run's record and checkpoint if it may be resumed here; else None."""
        context = self._context
        if not context.resume_runs:
            return None
        record = await context.store.get_run(run_id)
        if record is None or record.is_finished or record.agent not in context.profiles:
            return None
        checkpoint = await context.store.get_checkpoint(run_id)
        if checkpoint is None or checkpoint.resumes >= context.max_resumes:
            return None
        return record, checkpoint

    async def past_checkpoint(self, lease: Lease, run_id: str) -> Lease:
        """``lease`` with a token above the stored checkpoint's: the in-process bus begins its
        tokens again after a restart (the caller releases the lease this returns)."""
        advance = getattr(self._context.bus.locks, "advance", None)
        if not callable(advance):
            return lease
        stored = await self._context.store.get_checkpoint(run_id)
        if stored is None:
            return lease
        advanced: Lease = advance(lease, stored.fence + 1)
        return advanced

    async def resume(self, record: RunRecord, lease: Lease, sent: float) -> bool:
        """Resume the run under ``lease`` (the session's lock, held for the run's id, taken by
        a request sent at ``sent``); False if it cannot be (the caller ends it lost).

        Raises ``AdmissionRejected`` when this worker has no slot for it now (nothing taken:
        the run stays resumable).
        """
        context = self._context
        run_id = record.run_id
        # a slot first: a worker too full to take the run now leaves it for another worker
        # or a later round (AdmissionRejected, to the caller), without spending a resume
        ticket = context.admission.reserve(record.principal)
        try:
            taken = await context.store.take_over_checkpoint(run_id, fence=lease.token)
        except StaleFence:
            ticket.release()
            return False
        except BaseException:
            ticket.release()
            raise
        if taken is None or taken.resumes > context.max_resumes:
            ticket.release()
            return False
        try:
            checkpoint = RunCheckpoint.from_dict(taken.data)
        except CheckpointError as exc:
            ticket.release()
            logger.error("cannot resume a run: %s", exc, extra={"run_id": run_id})
            return False
        profile = context.profiles[record.agent]
        options = resumed_options(record, taken.data, profile.run_timeout)
        handle = RunHandle(
            run_id,
            record.session_id,
            record.principal,
            profile,
            options,
            lease,
            ticket,
            lease_deadline=self._fencing.deadline_after(sent),
        )
        # its usage goes on from the checkpoint's, and its budgets are charged what it uses
        # here (no reservation: it was admitted when it started)
        before = checkpoint.usage
        handle.usage = dataclasses.replace(before)  # a copy, with its cache/reasoning counts
        handle.usage_before = before.input_tokens + before.output_tokens
        if context.budgets is not None:
            handle.budget = context.budgets.account(record.principal, record.agent)
        # running until the runtime asks again (the record keeps saying waiting meanwhile)
        handle.status = "running"
        handle.created_at = record.created_at
        handle.started_at = record.started_at
        handle.resumed_from = taken
        handle.checkpoint_step = taken.step
        handle.recorded = True  # stored long ago
        events = context.events
        last = await events.last_seq(run_id)
        if last is None:
            # the log did not outlive the process (in-process bus) or Redis's data: a new one,
            # whose seq goes on from the checkpoint's
            await events.create(
                run_id, session_id=record.session_id, fence=lease.token, after=taken.event_seq
            )
            last = taken.event_seq
        handle.seq = last
        context.hold(handle)
        await context.bus.router.register(run_id, record.session_id)
        # a cancel asked while no worker held the run (read once routed here: see
        # app.runs.cancel_marks); the driver then ends it cancelled before going on
        handle.cancel_reason = await context.cancel_marks.reason(run_id)
        handle.task = context.spawn(self._driver.execute(handle), run_id)
        if self._grace is not None and abandoned_without_readers(taken.data, checkpoint):
            self._grace.resumed(run_id)
        reason = taken.handover or "worker_lost"
        context.metrics.runs_resumed.labels(reason).inc()
        logger.warning(
            "resuming a run from its checkpoint",
            extra={"run_id": run_id, "reason": reason, "step": taken.step},
        )
        return True


def abandoned_without_readers(data: Mapping[str, Any], checkpoint: RunCheckpoint) -> bool:
    """True if the resumed run is to be cancelled when nobody reads it: its request streamed
    it (or waited for it) with ``on_disconnect=cancel``, and it does not wait for an answer (a
    person may answer hours later, with no stream open: AI SDK and AG-UI streams end at the
    request)."""
    request = data.get(REQUEST_KEY)
    if not isinstance(request, Mapping) or request.get("on_disconnect") != "cancel":
        return False
    return not any(call.state == "awaiting_approval" for call in checkpoint.calls)
