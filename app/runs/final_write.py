"""A run's final write, kept in memory and retried while the store cannot be reached.

A run's end is one transaction under its lease's fencing token (``Store.end_run``): its turn
(the messages of a completed run, the stopped turn of a cancelled one), its status with output,
error and usage, and its checkpoint deleted (nothing is left to resume). When the store
refuses it, the turn alone tells which part it refused, as two separate writes would have.
When the store answers ``StorageUnavailable`` the run still ends for everyone else:
its readers get its terminal event and its slot is freed. What it has not written yet waits
here (``FinalWrites``) and is retried with capped exponential backoff until it lands, the
store refuses it for good, or the run's fence is lost: another holder has the session's lock,
or the store saw a newer token. A stale token is never written.

With the in-process bus (one worker) the run keeps its session's lock until its write
settles, so the session's next turn cannot start before this one is stored; a start that
finds the lock held by such a run tries the write at once (``flush``) and, once it landed,
takes the lock. With a shared bus the terminal event releases the lock in the same step, so
a newer holder's token, checked before each attempt and by the store itself, ends the retry.

At shutdown the drain keeps retrying up to its budget (``settle``) and logs each run whose
end could not be written; such a run is left unfinished in the store, and the lost-run sweep
fails it ``worker_lost`` at the next start, as for any run its worker never ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.messages import message_to_dict
from app.bus.base import BusError
from app.runs.branches import mark_branch
from app.runs.context import RunContext
from app.runs.handle import Outcome, RunHandle, lost_outcome
from app.runs.turns import stopped_turn
from app.storage import RunNotFound, StaleFence, StorageUnavailable, Store, WebhookMessage

__all__ = ["FinalWrite", "FinalWrites", "write_final"]

logger = logging.getLogger("app.runs")

FIRST_DELAY = 0.1
"""Seconds before the first retry; each next one waits twice as long, up to ``MAX_DELAY``."""
MAX_DELAY = 5.0

# what a retry may cure: the database unreachable, a call timed out
_TRANSIENT = (StorageUnavailable, TimeoutError, OSError)


@dataclass(slots=True, eq=False)
class FinalWrite:
    """What a run's end still has to store: its turn (None once stored, or when there is
    none) and its outcome."""

    handle: RunHandle
    outcome: Outcome
    turn: list[dict[str, Any]] | None
    attempts: int = 0
    # an earlier attempt at the turn failed without saying whether it was committed
    turn_uncertain: bool = False
    # the webhook message of the run's end, queued in the same write (app.webhooks)
    webhook: WebhookMessage | None = None
    # the run's checkpoint was deleted with its end
    checkpoint_dropped: bool = False

    @classmethod
    def of(cls, handle: RunHandle, outcome: Outcome) -> FinalWrite:
        """The writes that end ``handle`` with ``outcome``."""
        turn: list[dict[str, Any]] | None = None
        if outcome.status == "completed" and outcome.messages:
            turn = [message_to_dict(m) for m in outcome.messages]
        elif outcome.status == "cancelled":
            turn = stopped_turn(handle.options.prompt, outcome.messages, outcome.data["reason"])
        if turn is not None:
            turn = mark_branch(turn, handle.options.branch_from)
        return cls(handle, outcome, turn)


async def write_final(store: Store, write: FinalWrite) -> bool:
    """One attempt at the run's final write: True once it is settled (stored, or refused for
    good, which is logged), False when the store could not be reached (try again).

    The first attempt may change ``write.outcome``: a completed run whose messages the store
    refuses ends failed, one whose fence is stale ends ``worker_lost``. Later attempts come
    after the run's terminal event went out, so they only log such a refusal.
    """
    handle = write.handle
    run_id = handle.run_id
    first = write.attempts == 0
    write.attempts += 1
    try:
        await _end(store, write)
    except StaleFence as exc:
        logger.error(
            "the store refused a stale write of the run's end: %s", exc, extra={"run_id": run_id}
        )
        if first and write.turn is not None:
            # the turn was refused: the run's end is the sweep's verdict; still written, if at
            # all, under the run's own token (the store decides)
            write.turn = None
            write.outcome = lost_outcome()
            return await _retry_outcome(store, write)
        return True
    except _TRANSIENT as exc:
        if write.turn is not None:
            write.turn_uncertain = True
        log = logger.warning if first else logger.debug
        log(
            "could not store the run's end (attempt %d): %s; it is kept and retried",
            write.attempts,
            exc,
            extra={"run_id": run_id, "status": write.outcome.status},
        )
        return False
    except RunNotFound:  # its session was deleted meanwhile, and the run with it
        return True
    except Exception:
        if write.turn is None:
            logger.exception("could not store the run's outcome", extra={"run_id": run_id})
            return True
        # the turn itself is what the store cannot take (it is not the store's reachability)
        write.turn = None
        if write.outcome.status == "completed":
            logger.exception("could not store the run's messages", extra={"run_id": run_id})
            write.outcome = Outcome.failed(
                "internal", "the run completed but its messages could not be stored"
            )
        else:
            logger.exception("could not store the stopped turn", extra={"run_id": run_id})
        return await _retry_outcome(store, write)
    return True


async def _retry_outcome(store: Store, write: FinalWrite) -> bool:
    """The outcome alone, after the turn was given up; counts as the same attempt."""
    write.attempts -= 1
    return await write_final(store, write)


async def _end(store: Store, write: FinalWrite) -> None:
    """The run's end in one write; a refusal that is neither a stale token nor the store out
    of reach is raised as the turn's if the turn alone is refused too, else as the outcome's
    (the turn then stored: ``write.turn`` is None)."""
    handle = write.handle
    if write.turn is not None and write.turn_uncertain:
        # the answer to an earlier attempt was lost: it may have been committed all the same
        stored = await store.list_messages(handle.session_id)
        if any(m.run_id == handle.run_id for m in stored):
            write.turn = None
    drop = handle.checkpoint_step is not None and not handle.fenced
    try:
        await store.end_run(
            handle.run_id,
            session_id=handle.session_id,
            messages=write.turn or (),
            status=write.outcome.status,
            output=write.outcome.output,
            error=write.outcome.error,
            usage=handle.usage.to_dict(),
            model=handle.usage.model,
            fence=handle.lease.token,
            webhook=write.webhook,
            delete_checkpoint=drop,
        )
    except (StaleFence, RunNotFound, *_TRANSIENT):
        raise
    except Exception:
        if write.turn is None:
            raise
        await _write_turn(store, write)  # raises if the turn is what the store refuses
        raise  # the turn is stored alone: the outcome is what it refuses
    write.turn = None
    write.checkpoint_dropped = drop


async def _write_turn(store: Store, write: FinalWrite) -> None:
    handle = write.handle
    assert write.turn is not None
    await store.append_messages(
        handle.session_id, handle.run_id, write.turn, fence=handle.lease.token
    )
    write.turn = None


@dataclass(slots=True, eq=False)
class _Pending:
    write: FinalWrite
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None


class FinalWrites:
    """This worker's runs whose final write waits for the store."""

    def __init__(
        self,
        context: RunContext,
        *,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self._context = context
        self._first_delay = first_delay
        self._max_delay = max_delay
        self._pending: dict[str, _Pending] = {}
        self._settled = asyncio.Event()
        self._settled.set()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def keep(self, write: FinalWrite) -> None:
        """Retry ``write`` (whose first attempt failed) until it settles."""
        pending = _Pending(write)
        self._pending[write.handle.run_id] = pending
        self._settled.clear()
        pending.task = asyncio.get_running_loop().create_task(
            self._retry(pending), name=f"final write {write.handle.run_id}"
        )

    async def flush(self, run_id: str) -> bool:
        """Try the run's pending write now; True if none is left (or there was none)."""
        pending = self._pending.get(run_id)
        if pending is None:
            return True
        return await self._attempt(pending)

    async def settle(self, timeout: float) -> list[str]:  # noqa: ASYNC109 - the drain's budget
        """Keep retrying for up to ``timeout`` seconds; the runs still unwritten then."""
        for pending in list(self._pending.values()):
            pending.wake.set()  # the drain's budget is short: try at once
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        return list(self._pending)

    async def aclose(self) -> None:
        """Stop retrying; log every run whose end could not be written."""
        for run_id, pending in list(self._pending.items()):
            write = pending.write
            logger.error(
                "could not store the end of a run (%d attempts): the store keeps it unfinished "
                "and the next start fails it worker_lost",
                write.attempts,
                extra={
                    "run_id": run_id,
                    "session_id": write.handle.session_id,
                    "status": write.outcome.status,
                },
            )
            if pending.task is not None:
                pending.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending.task
            await self._settle(pending)

    async def _retry(self, pending: _Pending) -> None:
        delay = self._first_delay
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await pending.wake.wait()
            pending.wake.clear()
            if await self._attempt(pending):
                return
            delay = min(self._max_delay, delay * 2)

    async def _attempt(self, pending: _Pending) -> bool:
        write = pending.write
        async with pending.lock:
            if write.handle.run_id not in self._pending:
                return True
            try:
                lost = await self._fence_lost(write.handle)
            except BusError:
                return False
            if lost:
                logger.error(
                    "gave up storing the end of a run: its session's lock has another holder, "
                    "so its fence is stale",
                    extra={"run_id": write.handle.run_id, "status": write.outcome.status},
                )
            elif not await write_final(self._context.store, write):
                return False
            else:
                logger.info(
                    "stored the end of a run after %d attempts",
                    write.attempts,
                    extra={"run_id": write.handle.run_id, "status": write.outcome.status},
                )
            await self._settle(pending)
            return True

    async def _fence_lost(self, handle: RunHandle) -> bool:
        holder = await self._context.bus.locks.holder(handle.session_id)
        return holder is not None and holder != handle.run_id

    async def _settle(self, pending: _Pending) -> None:
        handle = pending.write.handle
        if self._pending.pop(handle.run_id, None) is None:
            return
        if not self._pending:
            self._settled.set()
        if not self._context.bus.shared:  # held until now (see the module's docstring)
            try:
                await self._context.bus.locks.release(handle.lease)
            except Exception:
                logger.exception(
                    "could not release the run's session lock", extra={"run_id": handle.run_id}
                )
