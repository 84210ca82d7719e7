"""The disconnect grace of ``on_disconnect=cancel``, and the readers that re-attach.

A client whose connection broke often comes straight back: a browser's EventSource
reconnects, ``@microsoft/fetch-event-source`` re-sends its POST (with the same
``Idempotency-Key``, an idempotent repeat). Cancelling at the disconnect would kill the run
that client is about to read again. So a disconnect only arms a timer of
``AGENT_DISCONNECT_GRACE`` seconds; when it fires, the run is cancelled (reason
``client_disconnected``) unless a reader re-attached meanwhile.

Re-attaching is counted per run in the bus's ``SharedValues`` (``attach:<run>``), so a
reader on any worker counts; each reader of a live run (``GET /v1/runs/{id}/events``, an
idempotent repeat) adds one. A policy remembers the count when it was made and a timer
compares: a higher count means somebody came back. The timer ends early when the run does.
With a grace of 0 the run is cancelled at once, as before the grace existed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.bus.base import BusError
from app.runs.context import RunContext
from app.runs.routing import Routing

__all__ = ["DisconnectGrace"]

logger = logging.getLogger("app.runs")

_REASON = "client_disconnected"


class DisconnectGrace:
    """Disconnect policies of this worker's responses, and their pending timers."""

    def __init__(self, context: RunContext, routing: Routing, grace: float, ttl: float) -> None:
        self._context = context
        self._routing = routing
        self._grace = grace
        # an attach count outlives any grace; bounded by the log's own lifetime
        self._ttl = max(ttl, 60.0)
        self._timers: set[asyncio.Task[None]] = set()

    @staticmethod
    def _name(run_id: str) -> str:
        return f"attach:{run_id}"

    @property
    def pending(self) -> int:
        """Timers armed and not yet fired."""
        return len(self._timers)

    async def attached(self, run_id: str) -> int:
        """A reader (re-)attached to the live run ``run_id``: the run's count of them."""
        return await self._context.bus.values.bump(self._name(run_id), self._ttl)

    def policy(self, run_id: str, baseline: int = 0) -> Callable[[], None]:
        """What a response of ``run_id`` calls when its client is gone: cancel the run
        after the grace, unless the count of readers passed ``baseline`` by then."""

        def gone() -> None:
            if self._grace <= 0:
                self._cancel_now(run_id)
                return
            timer = asyncio.get_running_loop().create_task(
                self._after_grace(run_id, baseline), name=f"grace:{run_id}"
            )
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)

        return gone

    def _cancel_now(self, run_id: str) -> None:
        if self._routing.cancel_local(run_id, _REASON):
            return
        if self._context.bus.shared:  # held by another worker (an idempotent repeat here)
            timer = asyncio.get_running_loop().create_task(self._cancel_remote(run_id))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)

    async def _after_grace(self, run_id: str, baseline: int) -> None:
        handle = self._context.runs.get(run_id)
        try:
            if handle is not None:
                # the run's end makes the timer pointless: stop waiting then
                await asyncio.wait([handle.finished], timeout=self._grace)
                if handle.done:
                    return
            else:
                await asyncio.sleep(self._grace)
            count = await self._context.bus.values.get(self._name(run_id))
        except BusError as exc:
            # whether a reader came back cannot be told: keep the run (a run is worth more
            # than the slot it holds; its own timeout still bounds it)
            logger.warning("disconnect grace of run %s: %s; not cancelled", run_id, exc)
            return
        if int(count or 0) > baseline:
            return
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
