"""A run's record in the store: every write that creates, moves or ends it, in one place.

Every write that moves or ends a run carries the fencing token of the run's session lease:
once the lost-run sweep (or another worker) wrote with a newer token, the store itself refuses
this worker's writes (``StaleFence``), whatever this worker believes about its lease. A
run's final write (its turn and outcome) is ``app.runs.final_write``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from app.errors import NotFound
from app.runs.handle import RunHandle, stored_parts
from app.storage import (
    CheckpointRecord,
    RunRecord,
    RunStatus,
    SessionNotFound,
    SessionOwnedByOther,
    StaleFence,
    Store,
    WebhookMessage,
)
from app.storage.schedules import FiringFence
from app.telemetry.metrics import Metrics

__all__ = ["RunRecords"]

logger = logging.getLogger("app.runs")


class RunRecords:
    """Writes of one worker's runs to the store."""

    def __init__(self, store: Store, metrics: Metrics | None = None) -> None:
        self._store = store
        self._metrics = metrics

    def create(
        self,
        handle: RunHandle,
        webhook_url: str | None = None,
        first: CheckpointRecord | None = None,
    ) -> asyncio.Task[None]:
        """Start writing the run's record beside its start (``handle.recorded``), with where
        its notifications go and its ``first`` checkpoint, if any (the same write).

        The run's model call is usually what its first event waits for, so the record is
        written meanwhile; the start answers only once it is stored, and the run awaits it
        before its own first write.
        """
        record = RunRecord(
            run_id=handle.run_id,
            session_id=handle.session_id,
            principal=handle.principal,
            agent=handle.agent,
            input=handle.input,
            input_parts=tuple(stored_parts(handle.options.parts) or ()),
            status=handle.status,
            created_at=handle.created_at,
            started_at=handle.started_at,
            metadata=dict(handle.metadata),
            webhook_url=webhook_url,
        )
        recorded = asyncio.get_running_loop().create_task(
            self._create(handle, record, handle.options.firing, first)
        )
        handle.recorded = recorded
        recorded.add_done_callback(functools.partial(_settled, handle))
        return recorded

    async def _create(
        self,
        handle: RunHandle,
        record: RunRecord,
        firing: FiringFence | None,
        first: CheckpointRecord | None,
    ) -> None:
        try:
            await self._store.create_run(
                record,
                firing=firing,
                create_session=handle.new_session,
                stateless=handle.options.stateless,
                checkpoint=first,
            )
        except SessionNotFound:
            # deleted between the ownership check and the lock
            raise NotFound(f"no session {record.session_id!r}") from None
        except SessionOwnedByOther:  # deleted, then re-created by someone else
            raise NotFound(f"no session {record.session_id!r}") from None
        if first is not None:  # resumable from here (as after RunCheckpointSink.save)
            handle.checkpoint_step = max(handle.checkpoint_step or 0, first.step)
            if self._metrics is not None:
                self._metrics.checkpoints_saved.inc()

    async def stored(self, handle: RunHandle) -> bool:
        """Wait for the run's record to be written; False if it was not (start() says why)."""
        recorded = handle.recorded
        if recorded is None or isinstance(recorded, bool):
            return bool(recorded)
        if not recorded.done():
            await asyncio.wait([recorded])
        return not recorded.cancelled() and recorded.exception() is None

    async def status(
        self, handle: RunHandle, status: RunStatus, webhook: WebhookMessage | None = None
    ) -> None:
        """Store the run's new status (running, waiting), with the ``webhook`` message it
        sends, if any; a failure is logged, not raised."""
        if handle.fenced or not await self.stored(handle):
            return
        try:
            await self._store.update_run(
                handle.run_id, status=status, fence=handle.lease.token, webhook=webhook
            )
        except StaleFence as exc:
            logger.error(
                "the store refused a stale write of the run's status: %s",
                exc,
                extra={"run_id": handle.run_id},
            )
        except Exception:
            logger.warning(
                "could not store the run's status",
                exc_info=True,
                extra={"run_id": handle.run_id, "status": status},
            )

    async def not_started(self, handle: RunHandle) -> None:
        """A start undone after its record was written: the record says so (and the run has
        nothing to resume from)."""
        if await self.stored(handle):
            with contextlib.suppress(Exception):
                await self._store.end_run(
                    handle.run_id,
                    session_id=handle.session_id,
                    status="failed",
                    error={"code": "internal", "message": "the run could not be started"},
                    fence=handle.lease.token,
                    delete_checkpoint=handle.checkpoint_step is not None,
                )


def _settled(handle: RunHandle, recorded: asyncio.Task[None]) -> None:
    """Keep whether the record was stored, not its write's task (which keeps its coroutine
    for as long as it is referred to: the run's life)."""
    if handle.recorded is recorded:
        handle.recorded = not recorded.cancelled() and recorded.exception() is None
