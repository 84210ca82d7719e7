"""Cancels and answers: to a run held here (the bus's ``CommandHandler`` side), or through the
bus to the worker that holds it.

Cancelling: a run inside the runtime is cancelled with ``agent.cancel_run`` (the runtime tells
its extensions and yields ``run.cancelled``); a run not yet there (queued, loading its
conversation) has its task cancelled. The first reason given wins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agent_runtime.agent import AgentRunConfig
from agent_runtime.errors import AgentClosedError, AnswerRefusedError
from agent_runtime.extensions.external import ExternalEvent
from app.bus.base import BusError
from app.errors import Draining, InvalidRequest, NotFound, Unavailable
from app.runs.context import RunContext
from app.runs.edits import check_edit, is_edit
from app.runs.handle import HANDOVER, RunHandle
from app.runs.stopping import RunStopper
from app.storage import RunRecord, RunStatus

__all__ = ["Routing"]

# seconds a cancel routed to no holder waits for the run's logged end
_SETTLE = 2.0
# seconds an answer to a run resumed for it waits for the run to ask again
_RESUME_WAIT = 10.0
# when an answer refused during a hand-over may be posted again (the sweep takes the run within
# a fraction of the lease)
_RETRY_HANDED_OVER = 1.0
# run ids are minted with this prefix (``app.runs.start``); a lease held by anything else is not
# a run's
_RUN_PREFIX = "run_"
_STATUS_OF: dict[str, RunStatus] = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
}


class Routing:
    """Where a cancel or an answer goes, and what it does on arrival."""

    def __init__(
        self,
        context: RunContext,
        stopper: RunStopper,
        resume_parked: Callable[[str, str], Awaitable[RunHandle | None]] | None = None,
    ) -> None:
        self._context = context
        self._stopper = stopper
        # resume a run no worker holds here, from its checkpoint (``LostRunSweep``): its
        # handle, or None if it cannot be (app.runs.resume)
        self.resume_parked = resume_parked

    # --- arriving here (CommandHandler) ------------------------------------------------------

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held here (``RunStopper.cancel_local``)."""
        return self._stopper.cancel_local(run_id, reason)

    def stop(self, handle: RunHandle, reason: str) -> bool:
        """Stop a run held here (``RunStopper.stop``)."""
        return self._stopper.stop(handle, reason)

    def deliver_local(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        """Offer an external answer to the agent holding the run (found by run, else session).

        The names of the extensions that took it; ``[]`` if the run is held here and took
        nothing (stale, duplicate, unknown call); None if this worker cannot speak for the run
        now: it does not hold it, holds it past its lease, hands it over, or resumed it and it
        has not asked again yet (the answer is to be posted again, see ``external_event``).
        A run named together with a session it does not belong to takes nothing.
        """
        context = self._context
        config = AgentRunConfig(session_id=session_id, request_id=run_id)
        handle = self._held(session_id, run_id)
        if handle is not None:
            if handle.session_id != session_id:
                return []  # another session's run: never answered for this one
            if context.lapsed(handle) or handle.cancel_reason == HANDOVER:
                return None  # an answer taken now could start a tool call nobody fences
            if handle.settling:
                return None  # resumed here, and not waiting again yet
        # no run here: any agent's extension may still hold it (they check session and run)
        agents = [context.agent_for(handle)] if handle is not None else context.all_agents()
        for agent in agents:
            try:
                accepted = agent.emit_external_event(event, config=config)
            except AgentClosedError:
                continue
            if accepted:
                return accepted
        return [] if handle is not None else None

    def _held(self, session_id: str, run_id: str | None) -> RunHandle | None:
        """The run held here that an answer naming ``run_id`` (or only its session) is for:
        the run itself, else the session's run held here."""
        runs = self._context.runs
        handle = runs.get(run_id) if run_id is not None else None
        if handle is None:
            handle = next((h for h in runs.values() if h.session_id == session_id), None)
        return handle

    # --- from a request ----------------------------------------------------------------------

    async def cancel(self, run_id: str, principal: str) -> tuple[str, RunStatus] | None:
        """``POST /v1/runs/{id}/cancel``: ("cancelling" | "finished", status), None if unknown."""
        context = self._context
        found = await context.find(run_id, principal)
        if found is None:
            return None
        if isinstance(found, RunHandle):  # held here, within its lease (see RunContext.find)
            if found.finalizing and not found.done:
                # its outcome is being stored: answer with it, not with "running" (shielded: a
                # client that leaves must not cancel the run's own future)
                await asyncio.shield(found.finished)
            if found.done or found.finalizing:
                return "finished", found.status
            if not self.cancel_local(run_id, "cancel_requested"):
                # its outcome was decided before the cancel could change it: answer with it
                # once it is stored (its terminal event is on its way)
                await asyncio.shield(found.finished)
                return "finished", found.status
            return "cancelling", context.live_status(found)
        if found.is_finished:
            return "finished", found.status
        router = context.bus.router
        if not await router.cancel(run_id, "cancel_requested"):
            # no worker holds it unfinished: it is ending as it was going to, or between owners
            # (its worker died or parked it). Marked first, for whoever takes it next, then
            # asked again: a resumer routes the run to itself before it reads the mark, so one
            # of the two sees the other (app.runs.cancel_marks)
            await context.cancel_marks.mark(run_id, "cancel_requested")
            if await router.cancel(run_id, "cancel_requested"):
                return "cancelling", found.status
            record = await context.store.get_run(run_id)
            if record is not None and record.is_finished:
                return "finished", record.status
            ended = await self._end_of(run_id)
            if ended is not None:
                return "finished", ended
            if self.resume_parked is not None:
                # parked (a shutdown handed it over) or lost, and resumable: a later sweep or
                # answer would bring it back, so take it here and end it as cancelled
                handle = await self.resume_parked(run_id, found.session_id)
                if handle is not None:
                    self.stop(handle, "cancel_requested")
                    return "cancelling", context.live_status(handle)
        return "cancelling", found.status

    async def _end_of(self, run_id: str) -> RunStatus | None:
        """The status the run's log ends with, waiting ``_SETTLE`` seconds at most for it."""
        events = self._context.events
        try:
            last = await events.last_seq(run_id)
            if last is None:
                return None
            subscription = await events.subscribe(run_id, after=max(0, last - 1))
        except BusError:
            return None
        try:
            async with asyncio.timeout(_SETTLE):
                while not subscription.finished:
                    for event in await subscription.next():
                        if event.terminal:
                            return _STATUS_OF[event.type]
        except (TimeoutError, BusError):
            pass
        finally:
            await subscription.aclose()
        return None

    async def external_event(
        self, principal: str, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str]:
        """Deliver an answer to a waiting run of the caller's session; 404 if not theirs.

        An answer the run refuses for a reason its sender can fix (an approval whose edited
        arguments the tool does not take) is an ``InvalidRequest`` with the runtime's code
        (``edit_not_allowed``, ``invalid_arguments``); the run keeps waiting.

        With tracing on, the delivery is a span linked to the run's (found through the bus
        when another worker holds the run), in the run's trace unless the request brought its
        own ``traceparent``.
        """
        try:
            return await self._traced_external_event(principal, session_id, run_id, event)
        except AnswerRefusedError as exc:
            self._context.metrics.external_events.labels("not_accepted").inc()
            raise InvalidRequest(str(exc), code=exc.code) from exc

    async def _traced_external_event(
        self, principal: str, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str]:
        context = self._context
        held = self._held(session_id, run_id)
        tracing = context.tracing
        if tracing is None:
            return await self._external_event(principal, session_id, run_id, event, held)
        known = run_id
        if known is None and held is not None:
            known = held.run_id
        try:
            run = await tracing.run_context(context.bus.values, session_id, known)
        except BusError:
            run = None  # the answer still goes through; only its link is lost
        with tracing.answer_span(event.name, session_id, run_id, run) as span:
            accepted = await self._external_event(principal, session_id, run_id, event, held)
            span.set_attribute("agent_runtime.external_event.accepted", bool(accepted))
            return accepted

    async def _external_event(
        self,
        principal: str,
        session_id: str,
        run_id: str | None,
        event: ExternalEvent,
        held: RunHandle | None,
    ) -> list[str]:
        context = self._context
        if run_id is None:
            run_id = held.run_id if held is not None else await self._leased_run(session_id)
        if run_id is None:
            # nothing holds the session: the answer can only be stale (409), or the session
            # not the caller's (404)
            session = await context.store.get_session(session_id)
            if session is None or session.principal != principal:
                context.metrics.external_events.labels("not_found").inc()
                raise NotFound(f"no session {session_id!r}")
            context.metrics.external_events.labels("not_accepted").inc()
            return []
        # the run resolved with its owner and its session, never inferred from the caller's
        # session: another principal's run is unknown (404), whatever session is named
        found = await context.find(run_id, principal, session_id)
        if found is None:
            context.metrics.external_events.labels("not_found").inc()
            raise NotFound(f"no run {run_id!r} in session {session_id!r}")
        if isinstance(found, RunRecord) and found.is_finished:
            context.metrics.external_events.labels("not_accepted").inc()
            return []
        if isinstance(found, RunRecord) and is_edit(event):
            # held elsewhere (or by nobody yet): the holder's refusal would not come back
            agent = context.agents.get(found.agent, context.agent)
            await check_edit(context.events, agent, run_id, event)
        accepted: list[str] | None = None
        if await self._leased(session_id, run_id):
            accepted = await context.bus.router.deliver_external(session_id, run_id, event)
        if accepted is None and self.resume_parked is not None:
            # no worker holds the run: parked at a shutdown (or its worker died) and not yet
            # taken by a sweep; resumed here, it asks again, and takes the answer here
            handle = await self.resume_parked(run_id, session_id)
            if handle is not None:
                accepted = await self._answer_resumed(handle, event)
        if not accepted and await self._handed_over(run_id, session_id):
            context.metrics.external_events.labels("not_accepted").inc()
            raise Draining(
                f"run {run_id!r} is being handed over to another server, which has not taken "
                "it yet: post the answer again (to any server)",
                retry_after=_RETRY_HANDED_OVER,
            )
        if accepted is None:
            record = await context.store.get_run(run_id)
            if record is not None and not record.is_finished:
                # between owners: its worker is gone and the next has not taken it, or has
                # and it has not asked again yet; a 409 would make a front end drop the
                # person's answer
                context.metrics.external_events.labels("not_accepted").inc()
                raise Unavailable(
                    f"run {run_id!r} is between servers (its server stopped or lost its "
                    "lease, and the next has not taken it up yet): post the answer again",
                    retry_after=_RETRY_HANDED_OVER,
                )
        context.metrics.external_events.labels("accepted" if accepted else "not_accepted").inc()
        return accepted or []

    async def _leased(self, session_id: str, run_id: str) -> bool:
        """Whether the run still holds its session's lease, as the shared bus says: a holder
        that lost it (Redis lost its data, or it was taken over) may not have noticed yet,
        and an answer it took now would be lost with the run's hand-over. Always true on the
        in-process bus, where a lease cannot outlive its holder."""
        if not self._context.bus.shared:
            return True
        return await self._holder(session_id) == run_id

    async def _leased_run(self, session_id: str) -> str | None:
        """The run holding the session's lease (on any worker)."""
        holder = await self._holder(session_id)
        # a sweep or a queue claim holds the lease under a name of its own, not a run id
        return holder if holder is not None and holder.startswith(_RUN_PREFIX) else None

    async def _holder(self, session_id: str) -> str | None:
        """The holder of the session's lease; 503 (post it again) if the bus cannot say."""
        try:
            return await self._context.bus.locks.holder(session_id)
        except BusError as exc:
            raise Unavailable(
                f"the session's lease cannot be read: {exc}", retry_after=_RETRY_HANDED_OVER
            ) from exc

    async def _handed_over(self, run_id: str, session_id: str) -> bool:
        """True if this draining worker hands the run over (or has parked it) and no worker
        holds it yet: an answer refused now is taken once another worker resumes the run."""
        context = self._context
        if not context.draining:
            return False
        local = context.runs.get(run_id)
        if local is not None:
            return local.cancel_reason == HANDOVER
        if await context.bus.locks.holder(session_id) is not None:
            return False
        record = await context.store.get_run(run_id)
        return record is not None and not record.is_finished

    async def _answer_resumed(self, handle: RunHandle, event: ExternalEvent) -> list[str] | None:
        """Give the answer to a run just resumed here, once it waits again (or has ended);
        None if it has not asked again in time."""
        asking = handle.until_asking()
        await asyncio.wait([asking, handle.finished], timeout=_RESUME_WAIT)
        if not handle.asking:
            return [] if handle.done else None
        return self.deliver_local(handle.session_id, handle.run_id, event)
