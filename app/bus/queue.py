"""Session queues: runs waiting, first come first served, for their session's lock.

A run started with ``multitask_strategy: enqueue`` while its session is busy waits in its
session's queue, beside the session's lock: in this worker's memory on the in-process bus, in
Redis on the shared one (``app.bus.redis.queue``), so that the runs queued from every worker
of a session form one line. An ``interrupt`` or ``rollback`` start goes to the front.

An entry lives as long as the worker that queued it keeps calling ``turn`` (each call renews
it for ``ttl``): a worker that dies leaves entries that lapse and are passed over, never a
queue that stays blocked. Only the entry's own worker takes the session's lock for it; the
step that commits the run to start (``claim``) and the step that cancels it (``cancel``) are
each atomic, so exactly one of them wins.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ["LocalSessionQueue", "QueueEntry", "QueueState", "SessionQueue"]


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A queued run: what ``GET /v1/runs/{id}`` shows of it before it starts.

    ``input_parts``: the JSON form of its input's content parts (media by reference), when
    it was given as parts.
    """

    run_id: str
    session_id: str
    principal: str
    agent: str
    input: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    input_parts: list[dict[str, Any]] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> QueueEntry:
        data = json.loads(text)
        return cls(**data)


@dataclass(frozen=True, slots=True)
class QueueState:
    """An entry as it stands: its place (1 = next; None once claimed to start)."""

    entry: QueueEntry
    position: int | None


class SessionQueue(Protocol):
    """One FIFO line of runs per session, bounded, with entries that lapse unless renewed."""

    async def push(
        self, entry: QueueEntry, *, front: bool, limit: int | None, ttl: float
    ) -> int | None:
        """Add the entry (at the back, or the front); its position, or None when the session
        already has ``limit`` entries."""
        ...

    async def turn(self, session_id: str, run_id: str, ttl: float) -> int | None:
        """Renew the entry and pass over lapsed ones ahead of it; its position (1: next),
        or None if it is no longer queued (cancelled, or lapsed)."""
        ...

    async def claim(self, session_id: str, run_id: str) -> bool:
        """Take the entry out of the line to start its run; False if it was cancelled."""
        ...

    async def cancel(self, session_id: str, run_id: str) -> bool:
        """Take the entry out of the line for good; False if it was not queued (any more)."""
        ...

    async def state(self, run_id: str) -> QueueState | None:
        """The entry and its position; None if there is no such entry."""
        ...

    async def length(self, session_id: str) -> int:
        """Entries queued in the session (lapsed ones may still count)."""
        ...

    def forget_claim(self, run_id: str) -> None:
        """The claimed entry's run has its record: it need not be shown from here any more."""
        ...


class LocalSessionQueue:
    """Session queues in this worker's memory (the in-process bus). Entries do not lapse:
    they cannot outlive the process that queued them."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}
        self._entries: dict[str, QueueEntry] = {}
        # claimed entries stay visible until their run's record exists (see Multitask)
        self._claimed: dict[str, tuple[QueueEntry, float]] = {}

    async def push(
        self, entry: QueueEntry, *, front: bool, limit: int | None, ttl: float
    ) -> int | None:
        line = self._lines.setdefault(entry.session_id, [])
        if limit is not None and len(line) >= limit:
            return None
        if front:
            line.insert(0, entry.run_id)
        else:
            line.append(entry.run_id)
        self._entries[entry.run_id] = entry
        return line.index(entry.run_id) + 1

    async def turn(self, session_id: str, run_id: str, ttl: float) -> int | None:
        line = self._lines.get(session_id, [])
        return line.index(run_id) + 1 if run_id in line else None

    async def claim(self, session_id: str, run_id: str) -> bool:
        entry = self._remove(session_id, run_id)
        if entry is None:
            return False
        self._claimed[run_id] = (entry, time.monotonic())
        return True

    async def cancel(self, session_id: str, run_id: str) -> bool:
        return self._remove(session_id, run_id) is not None

    async def state(self, run_id: str) -> QueueState | None:
        entry = self._entries.get(run_id)
        if entry is not None:
            line = self._lines.get(entry.session_id, [])
            return QueueState(entry, line.index(run_id) + 1)
        claimed = self._claimed.get(run_id)
        if claimed is None:
            return None
        if time.monotonic() - claimed[1] > 60:  # its run is recorded long since
            del self._claimed[run_id]
            return None
        return QueueState(claimed[0], None)

    async def length(self, session_id: str) -> int:
        return len(self._lines.get(session_id, ()))

    def forget_claim(self, run_id: str) -> None:
        """The claimed run's record exists: nothing more to show from here."""
        self._claimed.pop(run_id, None)

    @property
    def queued(self) -> int:
        """Entries queued in every session (for leak checks)."""
        return len(self._entries)

    def _remove(self, session_id: str, run_id: str) -> QueueEntry | None:
        line = self._lines.get(session_id)
        if line is None or run_id not in line:
            return None
        line.remove(run_id)
        if not line:
            del self._lines[session_id]
        return self._entries.pop(run_id, None)
