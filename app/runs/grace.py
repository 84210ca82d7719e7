"""The disconnect grace of ``on_disconnect=cancel``, and the readers that re-attach.

A client whose connection broke often comes straight back: a browser's EventSource
reconnects, ``@microsoft/fetch-event-source`` re-sends its POST (with the same
``Idempotency-Key``, an idempotent repeat). Cancelling at the disconnect would kill the run
that client is about to read again. So a disconnect only arms a timer of
``AGENT_DISCONNECT_GRACE`` seconds; when it fires, the run is cancelled (reason
``client_disconnected``) unless another reader attached to it meanwhile.

Each reader of a live run (``GET /v1/runs/{id}/events``, an idempotent repeat) notes the time
it attached in the bus's ``SharedValues`` (``attach:<run>``, kept a little longer than the
grace), so a reader on any worker counts; the timer compares that time with the moment its
response began. (Not with the disconnect's: a retry may attach before the server has even
noticed that the first connection broke.)
The timer ends early when the run does. With a grace of 0 the run is cancelled at once, as
before the grace existed.

A reader renews its mark every ``refresh`` seconds while it reads (the SSE ping interval), so
that a run resumed on another worker (``resumed``) can tell a client still reading, through
any worker, from one that is gone: such a run, whose request cancels it once nobody reads it,
is cancelled if no mark is renewed within the grace or a renewal period, whichever is longer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from app.bus.base import BusError
from app.runs.context import RunContext
from app.runs.stopping import RunStopper

__all__ = ["DisconnectGrace"]

logger = logging.getLogger("app.runs")

_REASON = "client_disconnected"
# an attach is remembered this much longer than the grace (a timer that fires late, a clock
# a little behind another host's)
_MARGIN = 10.0


class DisconnectGrace:
    """Disconnect policies of this worker's responses, and their pending timers."""

    def __init__(
        self, context: RunContext, stopper: RunStopper, grace: float, refresh: float = 15.0
    ) -> None:
        self._context = context
        self._stopper = stopper
        self._grace = grace
        # how often every reader renews its mark (the SSE ping interval)
        self._refresh = refresh
        self._timers: set[asyncio.Task[None]] = set()

    @property
    def refresh(self) -> float | None:
        """How often a reader of a live run renews its mark; None when none is kept
        (a grace of 0)."""
        return self._refresh if self._grace > 0 else None

    @staticmethod
    def _name(run_id: str) -> str:
        return f"attach:{run_id}"

    @property
    def pending(self) -> int:
        """Timers armed and not yet fired."""
        return len(self._timers)

    async def attached(self, run_id: str) -> None:
        """A reader (re-)attached to the live run ``run_id``, or is still reading it (each
        reader renews its mark every ``refresh`` seconds)."""
        if self._grace > 0:
            ttl = max(self._grace, self._refresh) + 2 * _MARGIN
            await self._context.bus.values.set(self._name(run_id), repr(time.time()), ttl)

    def resumed(self, run_id: str) -> None:
        """The run, whose request cancels it once nobody reads it, was resumed here: its
        client's connection was to the worker it left. Cancel it unless a reader attaches,
        or renews its mark (one still reading through the old worker), within the grace or
        a renewal period, whichever is longer."""
        if self._grace <= 0:
            return  # no marks kept: a reader cannot be told from none, so the run goes on
        window = max(self._grace, self._refresh + _MARGIN)
        self._track(self._after_grace(run_id, time.time(), window), f"grace:{run_id}")

    def policy(self, run_id: str) -> Callable[[], None]:
        """What a response of ``run_id`` calls when its client is gone: cancel the run
        after the grace, unless another reader attached since the policy was made (as the
        response began; a reader's own attach comes before)."""
        since = time.time()

        def gone() -> None:
            if self._grace <= 0:
                self._cancel_now(run_id)
                return
            self._track(self._after_grace(run_id, since, self._grace), f"grace:{run_id}")

        return gone

    def _track(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        timer = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    def _cancel_now(self, run_id: str) -> None:
        if not self._stopper.cancel_local(run_id, _REASON) and self._context.bus.shared:
            # held by another worker (an idempotent repeat was answered here)
            self._track(self._cancel_remote(run_id), f"cancel:{run_id}")

    async def _after_grace(self, run_id: str, since: float, grace: float) -> None:
        handle = self._context.runs.get(run_id)
        try:
            if handle is not None:
                # the run's end makes the timer pointless: stop waiting then
                await asyncio.wait([handle.finished], timeout=grace)
                if handle.done:
                    return
            else:
                await asyncio.sleep(grace)
            last = await self._context.bus.values.get(self._name(run_id))
        except BusError as exc:
            # whether a reader came back cannot be told: keep the run (its own timeout still
            # bounds it)
            logger.warning("disconnect grace of run %s: %s; not cancelled", run_id, exc)
            return
        if last is not None and float(last) > since:
            return  # somebody came back for it
        if not self._stopper.cancel_local(run_id, _REASON) and self._context.bus.shared:
            await self._cancel_remote(run_id)

    async def _cancel_remote(self, run_id: str) -> None:
        try:
            await self._context.bus.router.cancel(run_id, _REASON)
        except BusError as exc:
            logger.warning("could not cancel run %s after its client left: %s", run_id, exc)

    async def aclose(self) -> None:
        """Stop the pending timers (at shutdown; the drain decides the runs' fate)."""
        timers = list(self._timers)
        for timer in timers:
            timer.cancel()
        if timers:
            await asyncio.wait(timers)
