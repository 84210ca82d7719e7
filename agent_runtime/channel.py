"""A bounded single-consumer channel between a run's task and the stream that reads it.

Cheaper than ``asyncio.Queue`` on the hot path (one deque, at most one waiter on each side) and
it can tell the producer when the consumer has caught up, which the run uses so that a consumer
closing its stream early cancels the run instead of finding it already completed.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, Literal, TypeVar

T = TypeVar("T")

__all__ = ["EMPTY", "Channel", "ChannelClosed"]

# consumed items the buffer keeps before it drops them in one step (a consumer that never
# quite catches up); a buffer the consumer emptied is cleared at once
_COMPACT_AT = 32


class ChannelClosed(Exception):
    """The producer closed the channel and every item was taken."""


class _Empty(enum.Enum):
    EMPTY = "empty"


EMPTY: Final = _Empty.EMPTY
"""What ``Channel.poll`` answers when no item is buffered (await ``readable()``, then poll)."""


class Channel(Generic[T]):
    """Bounded FIFO with one producer side (possibly several tasks) and one consumer.

    The buffer is a list read from ``_head`` and cleared whenever the consumer empties it, so
    a channel whose consumer waits (a run waiting for an answer, maybe for hours) holds no
    storage for items; a ``deque`` keeps a block of 64 slots even when empty.
    """

    __slots__ = (
        "_buffer",
        "_closed",
        "_get_waiter",
        "_head",
        "_idle_waiters",
        "_limit",
        "_put_waiters",
        "tap",
    )

    def __init__(self, limit: int = 64) -> None:
        self._buffer: list[T] = []
        self._head = 0
        self._limit = limit
        self._get_waiter: asyncio.Future[None] | None = None
        # created on first use: most channels never fill up, and idle runs are many
        self._put_waiters: deque[asyncio.Future[None]] | None = None
        self._idle_waiters: list[asyncio.Future[None]] | None = None
        self._closed = False
        self.tap: Callable[[T], bool] | None = None
        """Offered each item ``put`` while the consumer waits with nothing buffered (it took
        every earlier item): True takes the item there, in the producer's task, and the
        consumer is not woken for it. It must not block or raise."""

    def __len__(self) -> int:
        return len(self._buffer) - self._head

    async def put(self, item: T) -> None:
        """Append ``item``, waiting while the channel is full (or hand it to ``tap``)."""
        tap = self.tap
        if tap is not None:
            # the consumer is parked in readable() with everything before this item taken:
            # taking the item here keeps the order, and spares the consumer's wake-up
            waiter = self._get_waiter
            if waiter is not None and not waiter.done() and tap(item):
                return
        while len(self._buffer) - self._head >= self._limit:
            waiter = asyncio.get_running_loop().create_future()
            if self._put_waiters is None:
                self._put_waiters = deque()
            waiters = self._put_waiters
            waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in waiters:
                    waiters.remove(waiter)
        self.put_nowait(item)

    def put_nowait(self, item: T) -> None:
        """Append ``item`` regardless of the limit (terminal events must never wait)."""
        self._buffer.append(item)
        waiter = self._get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        """No more items will come; the consumer ends after taking what is buffered."""
        self._closed = True
        waiter = self._get_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> T:
        """Take the next item, waiting for one; raises ChannelClosed at the end."""
        while True:
            item = self.poll()
            if item is not EMPTY:
                return item
            try:
                await self.readable()
            except BaseException:
                self._get_waiter = None  # a consumer gone is not waiting
                raise

    def poll(self) -> T | Literal[_Empty.EMPTY]:
        """The next item, or ``EMPTY`` if none is buffered; raises ChannelClosed at the end.

        With ``readable()``, the consumer's loop without a coroutine of the channel's own:
        ``get()`` costs a coroutine frame for as long as it waits.
        """
        self._get_waiter = None  # the consumer runs again
        buffer = self._buffer
        head = self._head
        if head == len(buffer):
            if self._closed:
                raise ChannelClosed
            return EMPTY
        item = buffer[head]
        head += 1
        if head == len(buffer):
            buffer.clear()  # frees the list's storage
            head = 0
        elif head >= _COMPACT_AT:
            del buffer[:head]
            head = 0
        self._head = head
        waiters = self._put_waiters
        if waiters:
            first = waiters.popleft()
            if not first.done():
                first.set_result(None)
        return item

    def readable(self) -> asyncio.Future[None]:
        """A future resolved once an item is put or the channel closes (after ``poll``
        answered ``EMPTY``); from then until the consumer polls again, it counts as idle."""
        self._wake_idle()
        waiter = asyncio.get_running_loop().create_future()
        self._get_waiter = waiter
        return waiter

    async def wait_consumer_idle(self) -> None:
        """Return once the consumer took every item and is waiting for the next one."""
        while len(self._buffer) > self._head or self._get_waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            if self._idle_waiters is None:
                self._idle_waiters = []
            self._idle_waiters.append(waiter)
            try:
                await waiter
            finally:
                if self._idle_waiters is not None and waiter in self._idle_waiters:
                    self._idle_waiters.remove(waiter)

    def _wake_idle(self) -> None:
        if self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, None
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
