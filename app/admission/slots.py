"""Admission control: execution slots, a bounded FIFO queue, and a per-principal cap.

At most ``max_running`` runs hold a slot; up to ``max_queued`` more wait for one, first come
first served, each for at most its own timeout. A request beyond the queue's bound, or beyond
its principal's cap (slots plus queue places), is refused at once. One ``Admission`` serves
one worker process; it is not shared across workers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

__all__ = ["Admission", "AdmissionRejected", "QueueTimeout", "Ticket"]


class AdmissionRejected(Exception):
    """No slot and no queue place: ``reason`` is ``overloaded``, ``principal_limit`` or
    ``draining``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class QueueTimeout(AdmissionRejected):
    """The ticket waited its whole timeout without getting a slot."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            "queue_timeout", f"no execution slot became free within {timeout:g} s; retry later"
        )


class Ticket:
    """One run's claim: a slot (``granted``) or a place in the queue. Release it exactly once."""

    __slots__ = ("_admission", "_future", "_granted", "principal", "released")

    def __init__(self, admission: Admission, principal: str) -> None:
        self._admission = admission
        self.principal = principal
        self._granted = False
        self.released = False
        self._future: asyncio.Future[None] | None = None

    @property
    def granted(self) -> bool:
        """True once the ticket holds an execution slot."""
        return self._granted

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109 - a queue deadline, not a call bound
        """Wait until the ticket holds a slot; raises QueueTimeout or AdmissionRejected."""
        if self.granted:
            return
        future = self._future
        assert future is not None, "a released ticket cannot wait"
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return  # granted in the same instant the deadline passed: keep the slot
            raise QueueTimeout(timeout) from None
        future.result()  # raises AdmissionRejected when the queue was flushed

    def abort(self) -> None:
        """Leave the queue: a pending ``wait`` raises AdmissionRejected('aborted')."""
        if self.granted or self.released:
            return
        self._admission._dequeue(self, AdmissionRejected("aborted", "the run was cancelled"))

    def release(self) -> None:
        """Give the slot (or queue place) back. Idempotent."""
        if not self.released:
            self.released = True
            self._admission._release(self)


class Admission:
    """Slots and queue of one worker."""

    def __init__(
        self,
        *,
        max_running: int,
        max_queued: int,
        per_principal: int | None = None,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.per_principal = per_principal
        self.running = 0
        self._queue: deque[Ticket] = deque()
        self._by_principal: dict[str, int] = {}
        self._on_change = on_change
        self.closed_reason: str | None = None

    @property
    def queued(self) -> int:
        """Tickets waiting for a slot."""
        return len(self._queue)

    @property
    def principals(self) -> int:
        """Principals holding at least one ticket (for leak checks)."""
        return len(self._by_principal)

    @property
    def full(self) -> bool:
        """True when a new ticket would be refused whoever asks: no free slot, no queue place."""
        return (self.running >= self.max_running or bool(self._queue)) and len(
            self._queue
        ) >= self.max_queued

    def reserve(self, principal: str) -> Ticket:
        """A slot now, or a queue place; raises AdmissionRejected when neither is allowed."""
        if self.closed_reason is not None:
            raise AdmissionRejected("draining", self.closed_reason)
        held = self._by_principal.get(principal, 0)
        if self.per_principal is not None and held >= self.per_principal:
            raise AdmissionRejected(
                "principal_limit",
                f"this caller already has {held} runs executing or queued "
                f"(the limit is {self.per_principal}); wait for one to finish",
            )
        ticket = Ticket(self, principal)
        if self.running < self.max_running and not self._queue:
            self.running += 1
            ticket._granted = True
        elif len(self._queue) < self.max_queued:
            ticket._future = asyncio.get_running_loop().create_future()
            self._queue.append(ticket)
        else:
            raise self.overloaded()
        self._by_principal[principal] = held + 1
        self._changed()
        return ticket

    def overloaded(self) -> AdmissionRejected:
        """The refusal of a ticket when the worker is full."""
        return AdmissionRejected(
            "overloaded",
            f"all {self.max_running} execution slots and {self.max_queued} queue places "
            "are taken; retry later",
        )

    def close(self, reason: str) -> None:
        """Refuse new tickets and fail every queued one with AdmissionRejected('draining')."""
        self.closed_reason = reason
        while self._queue:
            ticket = self._queue.popleft()
            future = ticket._future
            if future is not None and not future.done():
                future.set_exception(AdmissionRejected("draining", reason))
                future.exception()  # retrieved here: a waiter may already be gone
        self._changed()

    def _dequeue(self, ticket: Ticket, error: AdmissionRejected) -> None:
        try:
            self._queue.remove(ticket)
        except ValueError:
            return
        future = ticket._future
        if future is not None and not future.done():
            future.set_exception(error)
            future.exception()  # retrieved here: the waiter may be gone
        self._changed()

    def _release(self, ticket: Ticket) -> None:
        count = self._by_principal.get(ticket.principal, 0) - 1
        if count > 0:
            self._by_principal[ticket.principal] = count
        else:
            self._by_principal.pop(ticket.principal, None)
        if ticket.granted:
            self.running -= 1
            self._grant_next()
        else:
            with contextlib.suppress(ValueError):  # flushed by close()
                self._queue.remove(ticket)
            future = ticket._future
            if future is not None and not future.done():
                future.cancel()
        self._changed()

    def _grant_next(self) -> None:
        while self._queue and self.running < self.max_running:
            ticket = self._queue.popleft()
            future = ticket._future
            if future is None or future.done():  # pragma: no cover - removed tickets are gone
                continue
            self.running += 1
            ticket._granted = True
            future.set_result(None)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.running, len(self._queue))
