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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from app.bus.base import BusError
from app.runs.context import RunContext
from app.runs.routing import Routing

__all__ = ["DisconnectGrace"]

logger = logging.getLogger("app.runs")

_REASON = "client_disconnected"
# an attach is remembered this much longer than the grace (a timer that fires late, a clock
# a little behind another host's)
_MARGIN = 10.0


class DisconnectGrace:
    """Disconnect policies of this worker's responses, and their pending timers."""

    def __init__(self, context: RunContext, routing: Routing, grace: float) -> None:
        self._context = context
        self._routing = routing
        self._grace = grace
        self._timers: set[asyncio.Task[None]] = set()

    @staticmethod
    def _name(run_id: str) -> str:
        return f"attach:{run_id}"

    @property
    def pending(self) -> int:
        """Timers armed and not yet fired."""
        return len(self._timers)

    async def attached(self, run_id: str) -> None:
        """A reader (re-)attached to the live run ``run_id``."""
        if self._grace > 0:
            await self._context.bus.values.set(
                self._name(run_id), repr(time.time()), self._grace + _MARGIN
            )

    def policy(self, run_id: str) -> Callable[[], None]:
        """What a response of ``run_id`` calls when its client is gone: cancel the run
        after the grace, unless another reader attached since the policy was made (as the
        response began; a reader's own attach comes before)."""
        since = time.time()

        def gone() -> None:
            if self._grace <= 0:
                self._cancel_now(run_id)
                return
            self._track(self._after_grace(run_id, since), f"grace:{run_id}")

        return gone

    def _track(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        timer = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    def _cancel_now(self, run_id: str) -> None:
        if not self._routing.cancel_local(run_id, _REASON) and self._context.bus.shared:
            # held by another worker (an idempotent repeat was answered here)
            self._track(self._cancel_remote(run_id), f"cancel:{run_id}")

    async def _after_grace(self, run_id: str, since: float) -> None:
        handle = self._context.runs.get(run_id)
        try:
            if handle is not None:
                # the run's end makes the timer pointless: stop waiting then
                await asyncio.wait([handle.finished], timeout=self._grace)
                if handle.done:
                    return
            else:
                await asyncio.sleep(self._grace)
            last = await self._context.bus.values.get(self._name(run_id))
        except BusError as exc:
            # whether a reader came back cannot be told: keep the run (its own timeout still
            # bounds it)
            logger.warning("disconnect grace of run %s: %s; not cancelled", run_id, exc)
            return
        if last is not None and float(last) > since:
            return  # somebody came back for it
        if not self._routing.cancel_local(run_id, _REASON) and self._context.bus.shared:
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
