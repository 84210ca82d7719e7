"""A bounded single-consumer channel between a run's task and the stream that reads it.

Cheaper than ``asyncio.Queue`` on the hot path (one deque, at most one waiter on each side) and
it can tell the producer when the consumer has caught up, which the run uses so that a consumer
closing its stream early cancels the run instead of finding it already completed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Channel", "ChannelClosed"]


class ChannelClosed(Exception):
    """The producer closed the channel and every item was taken."""


class Channel(Generic[T]):
    """Bounded FIFO with one producer side (possibly several tasks) and one consumer."""

    __slots__ = ("_buffer", "_closed", "_get_waiter", "_idle_waiters", "_limit", "_put_waiters")

    def __init__(self, limit: int = 64) -> None:
        self._buffer: deque[T] = deque()
        self._limit = limit
        self._get_waiter: asyncio.Future[None] | None = None
        # created on first use: most channels never fill up, and idle runs are many
        self._put_waiters: deque[asyncio.Future[None]] | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._closed = False

    def __len__(self) -> int:
        return len(self._buffer)

    async def put(self, item: T) -> None:
        """Append ``item``, waiting while the channel is full."""
        while len(self._buffer) >= self._limit:
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
        buffer = self._buffer
        while not buffer:
            if self._closed:
                raise ChannelClosed
            self._wake_idle()
            waiter = asyncio.get_running_loop().create_future()
            self._get_waiter = waiter
            try:
                await waiter
            finally:
                self._get_waiter = None
        item = buffer.popleft()
        waiters = self._put_waiters
        if waiters:
            first = waiters.popleft()
            if not first.done():
                first.set_result(None)
        return item

    async def wait_consumer_idle(self) -> None:
        """Return once the consumer took every item and is waiting for the next one."""
        while self._buffer or self._get_waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._idle_waiters:
                    self._idle_waiters.remove(waiter)

    def _wake_idle(self) -> None:
        if self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
