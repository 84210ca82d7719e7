"""The SQLite store's second connection, used on the event loop for a run's short operations.

Handing an operation to the store's thread costs more than most of a run's operations do:
the thread and the loop pass the GIL back and forth around every statement (SQLite releases
it for each step), and each pass is a futex wake-up and a context switch. Under one-word
runs the hand-offs were about 40 % of the server's CPU, the statements a few percent. So the
few operations a run makes on its way (read its session and its conversation if short,
create it with its first checkpoint, save its checkpoints if small, record its status and
its end) run on the loop, on a connection of their own, when that can be done without
waiting:

- in the order the store's operations were submitted: a short one runs here only once the
  thread is idle (every job submitted has been answered), and until then it waits in a line
  the store's later operations join behind it; so an operation never overtakes another,
  and never runs beside the thread's own transaction;
- without waiting for a lock: the connection's busy timeout is zero, and an operation that
  meets a lock another process holds (several workers on one file) goes to the thread,
  which waits for it as before. Nothing of it was written: a write that finds the lock
  taken fails at its ``BEGIN IMMEDIATE``;
- without a WAL checkpoint: SQLite's automatic one (which syncs the files) is off on this
  connection, and every ``CHECKPOINT_EVERY`` writes made here a passive checkpoint runs on
  the thread instead, as one of its jobs (the short operations wait for it on the loop, as a
  writer waits for SQLite's own checkpoint).

What the loop is held for is the statements' own work: measured under one-word runs, about 75
µs an operation at the median, 330 µs at the 99th percentile, 1 ms at most.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeVar

from app.storage.sqlite.jobs import JobThread, settle

__all__ = ["CHECKPOINT_EVERY", "LoopConnection", "in_transaction"]

logger = logging.getLogger("app.storage")

T = TypeVar("T")

CHECKPOINT_EVERY: Final = 64
"""Writes on the loop's connection between two passive WAL checkpoints on the thread (a
run's start and end write about 30 pages; SQLite's own default is every 1,000 pages)."""

_MISSED: Final = object()
_BUSY: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


def in_transaction(db: sqlite3.Connection, function: Callable[..., T], *args: Any) -> T:
    """``function(db, *args)`` in one write transaction: committed, or rolled back on error.

    IMMEDIATE takes the write lock up front, so a transaction that reads and then writes
    cannot fail half-way on another process's lock.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        result = function(db, *args)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return result


class _Waiting(NamedTuple):
    future: asyncio.Future[Any]
    name: str
    function: Callable[..., Any]
    args: tuple[Any, ...]
    short: tuple[bool, Callable[..., Any]] | None
    """For a short operation: whether it writes, and how it runs on the thread."""


class LoopConnection:
    """A connection to the store's file for operations run on the loop, and the line that
    keeps the store's operations in the order they were submitted; see the module."""

    def __init__(self, jobs: JobThread, checkpoint: Callable[[], None]) -> None:
        """``checkpoint``: a passive WAL checkpoint, run on the thread."""
        self._jobs = jobs
        self._checkpoint = checkpoint
        self._db: sqlite3.Connection | None = None
        self._writes = 0
        # operations submitted while a short one waits for the thread to be idle
        self._line: deque[_Waiting] = deque()
        jobs.on_idle = self._move_line
        self.operations = 0
        """Operations run here so far (the others ran on the thread)."""
        self.checkpoints = 0
        """Passive checkpoints handed to the thread so far."""

    def open(self, path: str) -> None:
        """Connect to ``path`` (on the store's thread, once it has made the file WAL).

        ":memory:" gets no connection: a second one would be another database."""
        if path == ":memory:":
            return
        db = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            db.close()
            raise
        self._db = db

    def close(self) -> None:
        """Close the connection (on the store's thread, before the thread's own)."""
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def on_thread(self, name: str, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``function(*args)`` on the store's thread, after every operation submitted before."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._line:
            self._line.append(_Waiting(future, name, function, args, None))
        else:
            self._jobs.submit(future, name, function, *args)
        return future

    def short(
        self,
        function: Callable[..., T],
        args: tuple[Any, ...],
        *,
        write: bool,
        on_thread: Callable[..., T],
    ) -> asyncio.Future[T]:
        """The future of ``function(db, *args)`` (in a write transaction if ``write``), run
        after every operation submitted before: here (done at once if nothing is ahead of
        it), or as ``on_thread(function, *args)`` on the thread when there is no connection
        here or a lock is held elsewhere."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        waiting = _Waiting(future, function.__name__, function, args, (write, on_thread))
        if self._line or not self._jobs.idle:
            self._line.append(waiting)
        else:
            self._run(waiting)
        return future

    def _run(self, waiting: _Waiting) -> None:
        """Run a short operation here, or hand it to the thread."""
        assert waiting.short is not None
        write, on_thread = waiting.short
        try:
            result = self._attempt(waiting.function, waiting.args, write)
        except BaseException as exc:  # handed to the caller, as the thread would
            settle(waiting.future, waiting.name, None, exc)
            return
        if result is _MISSED:
            args = (waiting.function, *waiting.args)
            self._jobs.submit(waiting.future, waiting.name, on_thread, *args)
        else:
            settle(waiting.future, waiting.name, result, None)

    def _attempt(self, function: Callable[..., Any], args: tuple[Any, ...], write: bool) -> Any:
        db = self._db
        if db is None:
            return _MISSED
        try:
            result = in_transaction(db, function, *args) if write else function(db, *args)
        except sqlite3.OperationalError as exc:
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _BUSY:
                return _MISSED
            raise
        self.operations += 1
        if write:
            self._writes += 1
            if self._writes >= CHECKPOINT_EVERY:
                self._writes = 0
                self.checkpoints += 1
                # a job of the thread's, so that no write runs beside it: it copies the
                # whole WAL and the next write starts the file over (one beside the writes
                # never completes, and the WAL would grow without end)
                done = self._jobs.run("wal_checkpoint", self._checkpoint)
                done.add_done_callback(_log_failure)
        return result

    def _move_line(self) -> None:
        """The thread is idle: hand the waiting operations on in order, the thread's to the
        thread and the short ones here, until a short one meets the thread busy again."""
        line = self._line
        jobs = self._jobs
        while line:
            waiting = line[0]
            if waiting.short is None:  # the thread keeps the order of its own jobs
                line.popleft()
                jobs.submit(waiting.future, waiting.name, waiting.function, *waiting.args)
            elif jobs.idle:
                line.popleft()
                self._run(waiting)
            else:
                return


def _log_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        logger.warning("a WAL checkpoint failed", exc_info=done.exception())
