"""Gates: hold streams at a point until a test opens them, from any thread or loop."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Gate", "resolve"]


class Gate:
    """Holds streams at a point until ``open()``; usable from any thread or loop.

    ``waiting`` counts the responses currently held, so a test can wait until N calls are in
    flight before acting.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self.waiting = 0
        self.passed = 0

    @property
    def is_open(self) -> bool:
        """True once ``open()`` was called."""
        return self._open

    def open(self) -> None:
        """Release every held stream, and let later ones through."""
        with self._lock:
            self._open = True
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(resolve, future)

    def enter(self) -> asyncio.Future[None]:
        """Count one more waiter now and return the future that resolves when the gate opens.

        Synchronous, so a caller can publish the new ``waiting`` count before it awaits.
        Pair it with ``leave``.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self.waiting += 1
            if self._open:
                future.set_result(None)
            else:
                self._waiters.append((loop, future))
        return future

    def leave(self, future: asyncio.Future[None]) -> None:
        """Stop waiting (the gate opened, or the waiter gave up)."""
        with self._lock:
            self.waiting -= 1
            self.passed += 1
            for index, (_loop, waiting) in enumerate(self._waiters):
                if waiting is future:
                    del self._waiters[index]
                    break

    async def wait(self) -> None:
        """Wait until the gate is open."""
        future = self.enter()
        try:
            await future
        finally:
            self.leave(future)


def resolve(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` unless it is done already (scheduled on its own loop)."""
    if not future.done():
        future.set_result(None)
