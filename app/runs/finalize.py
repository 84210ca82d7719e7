"""A run's one end: store the outcome, release its hold, append its terminal event.

Every path out of a run goes through ``Finalizer.finalize`` exactly once (or, for a start
undone before the run's task existed, ``Finalizer.abandon``), so exactly one terminal event is
appended per run, always last.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from app.bus.base import BusError
from app.runs.context import RunContext
from app.runs.final_write import FinalWrite, FinalWrites, write_final
from app.runs.handle import HANDOVER, Outcome, RunHandle, lost_outcome, now
from app.runs.handover import HandOver
from app.runs.multitask import withdraw_confirmations
from app.runs.records import RunRecords
from app.storage import WebhookMessage

__all__ = ["Finalizer"]

logger = logging.getLogger("app.runs")


class Finalizer:
    """Ends this worker's runs."""

    def __init__(
        self, context: RunContext, records: RunRecords, writes: FinalWrites, handover: HandOver
    ) -> None:
        self._handover = handover
        self._context = context
        self._records = records
        self._writes = writes

    async def finalize(self, handle: RunHandle, outcome: Outcome) -> None:
        """Store the outcome, release the run's hold, append its one terminal event."""
        if handle.finalizing:  # pragma: no cover - guarded by the callers
            return
        handle.finalizing = True
        context = self._context
        records = self._records
        run_id = handle.run_id
        handed_over = outcome.status == "cancelled" and outcome.data.get("reason") == HANDOVER
        resumable = handle.fenced and context.resume_runs and handle.checkpoint_step is not None
        if (handed_over or resumable) and await self._handover.park(handle):
            return  # it goes on elsewhere (app.runs.handover): this worker ends nothing
        if handed_over:
            outcome = Outcome.cancelled("shutdown")
        if handle.fenced:
            # whatever the run got to, it ended past its lease: the sweep's verdict, written
            # (if at all) only under the lease's token (app.runs.fencing)
            outcome = lost_outcome()
        write: FinalWrite | None = None
        # the end's write deletes the run's checkpoint with it, once it lands
        checkpoint_kept = handle.checkpoint_step is not None and not handle.fenced
        if await records.stored(handle):
            write = FinalWrite.of(handle, outcome)
            write.webhook = self._webhook(handle, outcome)
            settled = await write_final(context.store, write)
            if write.webhook is not None and context.webhooks is not None:
                context.webhooks.wake()
            outcome = write.outcome  # a refusal of the turn changes it
            checkpoint_kept = checkpoint_kept and not write.checkpoint_dropped
            if settled:
                write = None
        handle.status = outcome.status
        handle.output = outcome.output
        handle.error = outcome.error
        handle.finished_at = now()
        handle.ticket.release()
        await withdraw_confirmations(context, handle, outcome)
        if handle.budget is not None:  # the reservation becomes the tokens the run used
            await handle.budget.settle(handle.spent_here())
        # the terminal event before the lock's release: a worker dying in between leaves a
        # sealed log and a lock that lapses, never an unsealed log. Yet a client that starts
        # the next run as soon as it reads this one's end must not find the session busy: a
        # shared bus releases the lock in the same step as the sealing append, the
        # in-process one just below without a suspension point in between.
        handle.seq += 1
        wire = handle.encoder.encode(handle.seq, outcome.event_type, time.time(), outcome.data)
        try:
            await context.events.append(run_id, wire, fence=handle.lease.token)
        except BusError:
            logger.exception("could not append the terminal event", extra={"run_id": run_id})
        if write is not None:
            # the store could not be reached: the write is retried from memory, and with the
            # in-process bus it keeps the session's lock until it lands (app.runs.final_write)
            self._writes.keep(write)
        try:
            if write is None or context.bus.shared:
                await context.bus.locks.release(handle.lease)
            await context.bus.router.unregister(run_id)
        except Exception:
            logger.exception("could not release the run's session lock", extra={"run_id": run_id})
        context.forget(run_id)
        elapsed = time.monotonic() - handle.t_accepted
        context.metrics.runs_total.labels(outcome.status).inc()
        context.metrics.run_duration.labels(outcome.status).observe(elapsed)
        handle.finish()
        if checkpoint_kept:
            # the run is over, nothing is left to resume, though its end's write did not say
            # so (refused, or waiting for the store): after its end, nobody waits on it
            try:
                await context.store.delete_checkpoint(run_id, fence=handle.lease.token)
            except Exception:
                logger.warning("could not delete a run's checkpoint", extra={"run_id": run_id})
        details: dict[str, Any] = {
            "run_id": run_id,
            "session_id": handle.session_id,
            "status": outcome.status,
            "duration_ms": round(elapsed * 1000),
            "events": handle.seq,
        }
        if outcome.error is not None:
            details["code"] = outcome.error.get("code")
        if outcome.status == "cancelled":
            details["reason"] = outcome.data.get("reason")
        logger.info("run finished", extra=details)

    def _webhook(self, handle: RunHandle, outcome: Outcome) -> WebhookMessage | None:
        """The message of the run's end, when the run has a webhook."""
        webhooks = self._context.webhooks
        url = self._context.webhook_url(handle)
        if webhooks is None or url is None:
            return None
        data = dict(outcome.data)
        if outcome.status == "completed" and "usage" not in data:
            data["usage"] = handle.usage.to_dict()
        return webhooks.end(
            url,
            run_id=handle.run_id,
            session_id=handle.session_id,
            agent=handle.agent,
            status=outcome.status,
            event_type=outcome.event_type,
            data=data,
        )

    async def abandon(self, handle: RunHandle) -> None:
        """Undo a start that failed before the run's task existed."""
        context = self._context
        context.forget(handle.run_id)
        handle.ticket.release()
        if handle.budget is not None:
            await handle.budget.release()
        with contextlib.suppress(Exception):
            await context.bus.locks.release(handle.lease)
        discard = getattr(context.events, "discard", None)
        if callable(discard):
            discard(handle.run_id)
        await self._records.not_started(handle)
        handle.finish()
