"""The retention of stateless sessions: those a protocol call made for itself.

A chat completion, a Responses call that names no conversation (or sends ``store: false``) and
an MCP call without ``session_id`` each run in a new session of their own. Such a session is
marked ``stateless`` when it is created: ``GET /v1/sessions`` never lists it (it is not a
conversation anyone started), and once it has been idle for ``AGENT_STATELESS_RETENTION``
seconds (no message stored, no run going on) every worker's reaper may delete it, with its
messages and runs, as ``DELETE /v1/sessions/{id}`` would. Until then it can be continued
(``previous_response_id``, the MCP result's ``session_id``), which moves its idle time on.

Each round takes a batch of candidates, oldest first, and deletes each under the session's
lock (as a deletion does), so that no run can start in it meanwhile; the store checks again,
in the delete itself, that the session is still idle and has no unfinished run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from app.bus.base import SessionLocks
from app.storage import Store

__all__ = ["StatelessReaper"]

logger = logging.getLogger("app.runs.stateless")

# sessions looked at per round; a full batch starts the next round at once
_BATCH = 100
# the longest wait between two rounds
_MAX_INTERVAL = 60.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class StatelessReaper:
    """Deletes this deployment's stateless sessions once idle past ``retention`` seconds."""

    def __init__(
        self,
        store: Store,
        locks: SessionLocks,
        *,
        retention: float,
        lock_seconds: float = 15.0,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._store = store
        self._locks = locks
        self._retention = retention
        self._lock_seconds = lock_seconds
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    @property
    def interval(self) -> float:
        """Seconds between two rounds: a quarter of the retention, at most a minute, so a
        session outlives its retention by a fraction of it."""
        return max(0.05, min(self._retention / 4, _MAX_INTERVAL))

    def start(self) -> None:
        """Run rounds in the background until ``aclose`` (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="stateless-retention"
            )

    async def aclose(self) -> None:
        """Stop the rounds; a deletion under way finishes on its own (the store's rule)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                deleted = await self.sweep()
            except Exception:
                logger.warning("could not delete idle stateless sessions", exc_info=True)
                deleted = 0
            # a full batch: more are past their retention, look again at once
            await asyncio.sleep(0 if deleted >= _BATCH else self.interval)

    async def sweep(self) -> int:
        """Delete one batch of stateless sessions idle past the retention; how many."""
        before = self._clock() - timedelta(seconds=self._retention)
        deleted = 0
        for session_id in await self._store.idle_stateless_sessions(before, _BATCH):
            if await self._delete(session_id, before):
                deleted += 1
        if deleted:
            logger.info("stateless sessions past their retention deleted", extra={"count": deleted})
        return deleted

    async def _delete(self, session_id: str, before: datetime) -> bool:
        # the session's lock, as DELETE /v1/sessions/{id} takes it: no run starts meanwhile
        lease = await self._locks.acquire(
            session_id, f"retention_{secrets.token_hex(8)}", self._lock_seconds
        )
        if lease is None:
            return False  # a run holds it: not idle after all
        try:
            return await self._store.delete_idle_stateless_session(session_id, before)
        finally:
            await self._locks.release(lease)
