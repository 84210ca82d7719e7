"""Deadlines that are many and far off, on one timer of the loop.

A run's time limit and a confirmation's expiry are deadlines minutes or hours away, and one
worker may hold thousands of runs waiting on them. A loop timer each (``loop.call_at``: its
handle, the loop's own timer, a copy of the context, the bound callback) costs about half a
kilobyte a deadline; here a deadline is one small entry in a heap, and the loop holds a single
timer, for the earliest::

    Deadlines.of(loop).at(when, callback, arg)  →  Deadline (cancel() it when it is moot)
    one loop timer at the heap's earliest entry → due entries called, the timer set again

``RunDeadline`` is ``asyncio.timeout`` on these deadlines, for a run's time limit.
"""

from __future__ import annotations

import asyncio
import heapq
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = ["Deadline", "Deadlines", "RunDeadline"]

A = TypeVar("A")

# loop timers may fire up to a millisecond early (uvloop counts whole milliseconds): a deadline
# due within that is treated as due, not waited for with a timer of zero
_EARLY = 0.001
# cancelled entries the heap keeps before it is rebuilt without them (if more than half of it)
_COMPACT_AT = 64


class Deadline(Generic[A]):
    """One deadline: ``callback(arg)`` at ``when`` (the loop's clock), unless cancelled."""

    __slots__ = ("_arg", "_callback", "_owner", "when")

    def __init__(
        self, owner: Deadlines, when: float, callback: Callable[[A], object], arg: A
    ) -> None:
        self._owner = owner
        self.when = when
        self._callback: Callable[[A], object] | None = callback
        self._arg: A | None = arg

    def __lt__(self, other: Deadline[Any]) -> bool:
        # deadlines due at the same time fire together, in no particular order
        return self.when < other.when

    @property
    def active(self) -> bool:
        """Neither called nor cancelled yet."""
        return self._callback is not None

    def cancel(self) -> None:
        """Do not call it (idempotent). What it would have been called with is let go of now;
        the entry itself leaves the heap at its time, or when the heap is rebuilt."""
        if self._callback is not None:
            self._callback = None
            self._arg = None
            self._owner._cancelled_one()


class Deadlines:
    """The deadlines of one event loop (``Deadlines.of(loop)``); used on that loop only."""

    __slots__ = ("_cancelled", "_heap", "_loop", "_timer", "_timer_when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[Deadline[Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_when = float("inf")
        self._cancelled = 0

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Deadlines:
        """The deadlines of ``loop`` (made on first use)."""
        found = _BY_LOOP.get(loop)
        if found is None:
            found = _BY_LOOP[loop] = cls(loop)
        return found

    def __len__(self) -> int:
        """Deadlines still to come (not cancelled)."""
        return len(self._heap) - self._cancelled

    def at(self, when: float, callback: Callable[[A], object], arg: A) -> Deadline[A]:
        """Call ``callback(arg)`` on the loop at ``when`` (``loop.time()``'s clock).

        ``callback`` should be a function shared by many deadlines (not a new closure or bound
        method each time): the entry keeps it for as long as it waits.
        """
        deadline = Deadline(self, when, callback, arg)
        self.push(deadline)
        return deadline

    def push(self, deadline: Deadline[Any]) -> None:
        """Schedule an entry built by a subclass of ``Deadline`` that is its own entry (one
        object where a wait and its deadline would be two); it must be active."""
        heapq.heappush(self._heap, deadline)
        if deadline.when < self._timer_when:
            self._schedule()

    def _cancelled_one(self) -> None:
        self._cancelled += 1
        heap = self._heap
        # rebuilt once they are most of it (or all of it: an idle loop keeps no entry or timer)
        if self._cancelled == len(heap) or (
            self._cancelled >= _COMPACT_AT and self._cancelled * 2 > len(heap)
        ):
            self._heap = [entry for entry in heap if entry._callback is not None]
            heapq.heapify(self._heap)
            self._cancelled = 0
            if not self._heap and self._timer is not None:
                self._timer.cancel()
                self._timer = None
                self._timer_when = float("inf")

    def _schedule(self) -> None:
        """The loop's timer at the earliest entry (none if there is none)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_when = float("inf")
        if self._heap:
            when = self._heap[0].when
            self._timer = self._loop.call_at(when, self._fire)
            self._timer_when = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_when = float("inf")
        heap = self._heap
        due = self._loop.time() + _EARLY
        while heap and heap[0].when <= due:
            entry = heapq.heappop(heap)
            callback, arg = entry._callback, entry._arg
            if callback is None:
                self._cancelled -= 1
                continue
            entry._callback = entry._arg = None
            try:
                callback(arg)
            except Exception as exc:  # one failing callback must not hold up the others
                self._loop.call_exception_handler(
                    {"message": "a deadline's callback failed", "exception": exc}
                )
        self._schedule()


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
    weakref.WeakKeyDictionary()
)


class RunDeadline(Deadline["RunDeadline"]):
    """``asyncio.timeout(delay)`` on the loop's shared deadlines, for a long time limit (itself
    the deadline's entry: one object a run).

    Used as ``with`` inside a task: at the deadline the task is cancelled, and leaving the
    block turns that cancellation (not one from elsewhere) into ``TimeoutError``. ``None``:
    no limit.
    """

    __slots__ = ("_cancelling", "_delay", "_expired", "_task")

    def __init__(self, delay: float | None) -> None:  # entered later: no Deadline.__init__
        self._delay = delay
        self._callback = None
        self._arg = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._expired = False

    def expired(self) -> bool:
        """True once the deadline passed and cancelled the task."""
        return self._expired

    def __enter__(self) -> RunDeadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("RunDeadline is used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._delay is not None:
            loop = asyncio.get_running_loop()
            owner = Deadlines.of(loop)
            Deadline.__init__(self, owner, loop.time() + self._delay, _expire, self)
            owner.push(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()
        task = self._task
        self._task = None
        if (
            self._expired
            and task is not None
            and exc_type is asyncio.CancelledError
            and task.uncancel() <= self._cancelling
        ):
            raise TimeoutError from exc


def _expire(timeout: RunDeadline) -> None:
    task = timeout._task
    if task is not None and not task.done():
        timeout._expired = True
        task.cancel()
