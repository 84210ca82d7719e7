"""The retention of uploads no conversation refers to.

A file that no session's stored messages refer to (never used in a run, or its sessions
deleted) is deleted once it is older than ``AGENT_FILE_RETENTION`` seconds, by every worker's
sweep (the store takes each row once), and its bytes with it when no other upload has the same
content. The same round removes what an interrupted upload left behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from app.storage import FileSweep, Store
from app.tasks import stop_task

__all__ = ["FileRetention"]

logger = logging.getLogger("app.files")

# files looked at per round; a full batch starts the next round at once
_BATCH = 100
# the longest wait between two rounds
_MAX_INTERVAL = 600.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class FileRetention:
    """Deletes unreferenced files older than ``retention`` seconds, in the background."""

    def __init__(
        self, store: Store, *, retention: float, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self._store = store
        self._retention = retention
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    @property
    def interval(self) -> float:
        """Seconds between two rounds: a tenth of the retention, at most ten minutes."""
        return max(0.05, min(self._retention / 10, _MAX_INTERVAL))

    def start(self) -> None:
        """Run rounds in the background until ``aclose`` (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="file-retention")

    async def aclose(self) -> None:
        """Stop the rounds; a deletion under way finishes on its own (the store's rule)."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _run(self) -> None:
        while True:
            try:
                swept = await self.sweep()
            except Exception:
                logger.warning("could not delete files past their retention", exc_info=True)
                swept = FileSweep(0, 0)
            await asyncio.sleep(0 if swept.files >= _BATCH else self.interval)

    async def sweep(self) -> FileSweep:
        """Delete one batch of unreferenced files past the retention; what went."""
        before = self._clock() - timedelta(seconds=self._retention)
        swept = await self._store.sweep_files(before, _BATCH)
        if swept.files or swept.blobs:
            logger.info(
                "files past their retention deleted",
                extra={"files": swept.files, "blobs": swept.blobs},
            )
        return swept
