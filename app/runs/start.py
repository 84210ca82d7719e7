"""Admission and start: a slot, the session, its lease, the run's record and log, its task.

::

    start()
      admit:   admission ticket (in memory, so a 429 costs nothing) → session read (store;
               404 if another's) → session lock (bus; 409 if held) → the replaced turn
               → session created if new and waiting for a slot → the run's handle
      launch:  wait for a slot (unless background) → record, with the session if new
               (beside the start) → event log and route → the run's task (``Driver.execute``)
      answer once the record is stored
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar

from agent_runtime.errors import ConfigurationError, OutputSchemaError
from agent_runtime.structured import aoutput_spec
from app.admission.budgets import BudgetHold
from app.admission.slots import AdmissionRejected, Ticket
from app.agents.build import AgentProfile
from app.bus.base import Lease
from app.errors import (
    AgentUnavailable,
    BudgetExceeded,
    Conflict,
    Draining,
    InvalidRequest,
    NotFound,
    Overloaded,
    ServiceError,
    SessionBusy,
)
from app.runs.checkpoints import first_with_record
from app.runs.context import RunContext
from app.runs.driver import Driver
from app.runs.fencing import Fencing
from app.runs.final_write import FinalWrites
from app.runs.finalize import Finalizer
from app.runs.handle import RunHandle, RunRequestOptions, new_run_id, now
from app.runs.records import RunRecords
from app.runs.stopping import RunStopper
from app.runs.turns import remove_replaced_turn
from app.storage import TERMINAL_STATUSES, SessionOwnedByOther, SessionRecord
from app.storage.files import FileMissing

if TYPE_CHECKING:
    from app.runs.multitask import StartFn

__all__ = ["BusyPolicy", "Starter"]

logger = logging.getLogger("app.runs")

ENDING_WAIT: Final = 2.0
"""Seconds a start waits for the lock of a run whose end is stored but whose terminal event
(which gives the lock back) is still on its way, before it answers ``session_busy``."""
_ENDING_POLL: Final = 0.01

_RETRY_AFTER_BUSY = 1.0
_RETRY_AFTER_DRAINING = 5.0
# the warm-up retries a failed agent with backoff (up to 30 s)
_RETRY_AFTER_UNAVAILABLE = 5.0


class BusyPolicy(Protocol):
    """What a start does when the session is busy (``app.runs.multitask``)."""

    async def on_busy(
        self,
        principal: str,
        session_id: str,
        run_id: str,
        active: str | None,
        options: RunRequestOptions,
    ) -> tuple[Lease | None, str | None]:
        """Given the principal, session, new run id, the lock's holder and the options: the
        lease it got after all and the run it superseded; no lease means busy (409)."""
        ...

    def lease_sent(self, run_id: str) -> float:
        """When the request that took a lease given to ``start`` (a queued run's) was sent:
        its deadline counts from then."""
        ...


BusyT = TypeVar("BusyT", bound=BusyPolicy)


class Starter(Generic[BusyT]):
    """Admits and starts this worker's runs.

    ``busy`` builds the busy policy from this starter's ``start`` (the policy starts the runs it
    queued): the two need each other, so the starter makes it and offers it as ``busy``.
    """

    def __init__(
        self,
        context: RunContext,
        records: RunRecords,
        driver: Driver,
        finalizer: Finalizer,
        stopper: RunStopper,
        fencing: Fencing,
        writes: FinalWrites,
        *,
        busy: Callable[[StartFn], BusyT],
    ) -> None:
        self._fencing = fencing
        self._writes = writes
        self._context = context
        self._records = records
        self._driver = driver
        self._finalizer = finalizer
        self._stopper = stopper
        self.busy = busy(self.start)

    def profile(self, name: str) -> AgentProfile:
        """The configured agent ``name``; ``NotFound`` if there is none."""
        profiles = self._context.profiles
        profile = profiles.get(name)
        if profile is None:
            raise NotFound(f"no agent {name!r}; configured: {', '.join(sorted(profiles))}")
        return profile

    async def _check_shape(self, options: RunRequestOptions) -> None:
        """A request's skill and response format, checked before anything is admitted."""
        core = self._context.agents.get(options.agent, self._context.agent)
        if options.skill is not None:
            if core.skills is None:
                raise NotFound(f"agent {options.agent!r} has no skills")
            skills = await core.skills.aload()  # read once, in a thread; cached after
            if options.skill not in skills:
                known = ", ".join(skills) or "none"
                raise NotFound(
                    f"agent {options.agent!r} has no skill {options.skill!r}; skills: {known}"
                )
        if options.response_format is not None:
            try:
                await aoutput_spec(response_format=options.response_format)
            except OutputSchemaError as exc:
                loc = ["body", "response_format", "json_schema", "schema", *exc.path]
                error = {"loc": loc, "msg": str(exc), "type": f"schema_{exc.kind}"}
                raise InvalidRequest(str(exc), extra={"errors": [error]}) from None
            except ConfigurationError as exc:
                raise InvalidRequest(str(exc)) from None

    async def start(
        self,
        principal: str,
        session_id: str,
        options: RunRequestOptions,
        *,
        run_id: str | None = None,
        lease: Lease | None = None,
    ) -> RunHandle:
        """Admit and start a run (see ``RunManager.start``); ``run_id`` and ``lease``: a
        queued run's, whose session lock was taken for it."""
        context = self._context
        profile = self.profile(options.agent)
        await self._check_shape(options)
        if context.draining:
            context.reject("draining")
            raise draining_problem()
        reason = context.unavailable(profile.name)
        if reason is not None:
            context.reject("agent_unavailable")
            raise AgentUnavailable(
                f"agent {profile.name!r} is unavailable: {reason}",
                retry_after=_RETRY_AFTER_UNAVAILABLE,
                extra={"agent": profile.name, "reason": reason},
            )
        # the budgets and admission first: in memory (or one Redis script), so a refused
        # request (429) costs no storage write and leaves no session behind, which keeps
        # refusals fast under overload
        hold = await self._budget(principal, profile.name)
        try:
            ticket = context.admission.reserve(principal)
        except AdmissionRejected as exc:
            context.reject(exc.reason)
            await _release(hold)
            raise admission_problem(exc) from None
        try:
            handle = await self._admit(
                principal, session_id, profile, options, ticket, run_id=run_id, lease=lease
            )
        except BaseException:
            ticket.release()
            await _release(hold)
            raise
        handle.budget = hold
        context.hold(handle)
        try:
            recorded = await self._launch(handle)
            if options.firing is not None:
                # a schedule's run proves it still holds its firing before anything of it
                # runs: a worker that stalled past the firing's lease calls no model or tool
                await asyncio.shield(recorded)
        except BaseException:
            await self._finalizer.abandon(handle)
            raise
        handle.task = context.spawn(self._driver.execute(handle), handle.run_id)
        try:
            await asyncio.shield(recorded)
        except asyncio.CancelledError:
            # the request went away
            self._stopper.cancel_local(handle.run_id, "client_disconnected")
            raise
        except BaseException:
            # not stored (session deleted meanwhile, or the store failed): nobody will learn
            # this run's id, so end it; it stores nothing more (see RunRecords.stored)
            self._stopper.cancel_local(handle.run_id, "cancel_requested")
            raise
        if options.file_ids:
            await self._reference_files(handle)
        logger.info(
            "run accepted",
            extra={
                "run_id": handle.run_id,
                "session_id": session_id,
                "principal": principal,
                "agent": profile.name,
                "status": handle.status,
                **({"input": options.input} if context.debug else {}),
            },
        )
        return handle

    async def _reference_files(self, handle: RunHandle) -> None:
        """Record that the session's messages refer to the files of the run's input (they
        cannot be deleted from now on); a file deleted since the input was taken ends the run
        before its model reads it (404 ``file_not_found``)."""
        try:
            await self._context.store.reference_files(handle.options.file_ids, handle.session_id)
        except BaseException as exc:
            self._stopper.cancel_local(handle.run_id, "cancel_requested")
            if isinstance(exc, FileMissing):
                raise NotFound(
                    "a file of the run's input was deleted before the run started",
                    code="file_not_found",
                ) from None
            raise

    async def _budget(self, principal: str, agent: str) -> BudgetHold | None:
        """The run's reservation of its token budgets; ``BudgetExceeded`` when one is used up."""
        budgets = self._context.budgets
        if budgets is None:
            return None
        try:
            return await budgets.hold(principal, agent)
        except BudgetExceeded:
            self._context.reject("budget_exceeded")
            raise

    async def _admit(
        self,
        principal: str,
        session_id: str,
        profile: AgentProfile,
        options: RunRequestOptions,
        ticket: Ticket,
        *,
        run_id: str | None,
        lease: Lease | None,
    ) -> RunHandle:
        """The session (created on first use) and its lock: the run's handle, or an error."""
        context = self._context
        # read, not created: a start refused below (409, an unknown ``replaces``) must not
        # bring back a session deleted meanwhile; a new one is created once the run is in
        session = await context.store.get_session(session_id)
        if session is not None and session.principal != principal:
            raise NotFound(f"no session {session_id!r}")
        run_id, lease, sent, opened, superseded = await self._lock(
            principal, session_id, options, ticket, run_id=run_id, lease=lease
        )
        await self._remove_replaced(session_id, options, superseded, lease)
        if session is None and not ticket.granted and not options.background:
            # it waits for a slot before its record is written: its session is visible meanwhile
            session = await self._visible_session(principal, session_id, options, lease)
        handle = RunHandle(
            run_id,
            session_id,
            principal,
            profile,
            options,
            lease,
            ticket,
            lease_deadline=self._fencing.deadline_after(sent),
        )
        handle.opened = opened
        if session is None:
            # a new session of a run that has its slot: the run's record creates it, in the
            # same write (a start refused before then leaves no session behind)
            handle.new_session = True
            handle.history_size = 0 if superseded is None else -1
        else:
            # a superseded run stored its turn since the session was read: read them back
            handle.history_size = session.message_count if superseded is None else -1
        return handle

    async def _lock(
        self,
        principal: str,
        session_id: str,
        options: RunRequestOptions,
        ticket: Ticket,
        *,
        run_id: str | None,
        lease: Lease | None,
    ) -> tuple[str, Lease, float, bool, str | None]:
        """The session's lock for the run, or `SessionBusy`: the run's id, its lease, when
        the lease was asked for, whether the run's log opened with it, the run it superseded."""
        context = self._context
        opened = False
        if run_id is None or lease is None:
            run_id = new_run_id()
            sent = context.clock()  # the lease's deadline counts from before the request
            if (ticket.granted or options.background) and options.replaces is None:
                # nothing to do under the lease before the run's log opens (no slot to wait
                # for, no turn to remove): the lease and the log in one step
                lease = await context.bus.claim_run(
                    run_id, session_id=session_id, ttl=context.lease_ttl
                )
                opened = lease is not None
            else:
                lease = await context.bus.locks.acquire(session_id, run_id, context.lease_ttl)
        else:
            sent = self.busy.lease_sent(run_id)
        active = None if lease is not None else await context.bus.locks.holder(session_id)
        # held by a run that ended while the store was out, until its end is stored: store
        # it now (the store answered above), and the lock is free
        if (
            lease is None
            and active is not None
            and active in self._writes
            and await self._writes.flush(active)
        ):
            active = None
        if lease is None and active is None:
            # the holder let go between the two calls (its run just ended): try once more, so
            # that the answer is the session's new state, not a 409 naming no run
            sent = context.clock()
            lease = await context.bus.locks.acquire(session_id, run_id, context.lease_ttl)
            if lease is None:
                active = await context.bus.locks.holder(session_id)
        if lease is None and active is not None and await self._end_stored(active):
            # its end is stored (a client polling the run reads it completed) and its
            # terminal event gives the lock back a moment later, on whichever worker holds it
            lease, sent, active = await self._after_end(session_id, run_id, active)
        superseded = None
        if lease is None:
            lease, superseded = await self.busy.on_busy(
                principal, session_id, run_id, active, options
            )
            sent = self.busy.lease_sent(run_id)
        if lease is None:
            context.reject("session_busy")
            if active is not None and not active.startswith("run_"):
                active = None  # held for a moment by a deletion or the lost-run sweep
            raise SessionBusy(
                f"session {session_id!r} already has an active run; wait for it to finish "
                "or cancel it",
                extra={"active_run_id": active},
            )
        return run_id, lease, sent, opened, superseded

    async def _end_stored(self, holder: str) -> bool:
        """Whether ``holder`` is a run whose end the store holds."""
        if not holder.startswith("run_"):
            return False
        record = await self._context.store.get_run(holder)
        return record is not None and record.status in TERMINAL_STATUSES

    async def _after_end(
        self, session_id: str, run_id: str, holder: str
    ) -> tuple[Lease | None, float, str | None]:
        """The session's lock once the ended ``holder`` gave it back, within
        ``ENDING_WAIT``: the lease, when it was asked for, and the holder if it was not."""
        context = self._context
        locks = context.bus.locks
        deadline = context.clock() + ENDING_WAIT
        while True:
            await asyncio.sleep(_ENDING_POLL)
            sent = context.clock()
            lease = await locks.acquire(session_id, run_id, context.lease_ttl)
            if lease is not None:
                return lease, sent, None
            active = await locks.holder(session_id)
            if active != holder or context.clock() >= deadline:
                return None, sent, active

    async def _remove_replaced(
        self,
        session_id: str,
        options: RunRequestOptions,
        superseded: str | None,
        lease: Lease,
    ) -> None:
        """Remove the turn the run replaces (regenerate, edit, rollback); the lock goes if not."""
        context = self._context
        replaces = options.replaces
        rollback = superseded is not None and options.multitask_strategy == "rollback"
        if rollback:
            replaces = superseded
        if replaces is not None:  # regenerate / edit / rollback: under the session's lock
            try:
                await remove_replaced_turn(context.store, session_id, replaces)
            except (NotFound, Conflict) as exc:
                if not rollback:
                    await context.bus.locks.release(lease)
                    raise
                # the superseded run stored no turn (it failed), or not as the last one
                logger.info("no turn to roll back: %s", exc, extra={"run_id": superseded})
            except BaseException:
                await context.bus.locks.release(lease)
                raise

    async def _visible_session(
        self, principal: str, session_id: str, options: RunRequestOptions, lease: Lease
    ) -> SessionRecord:
        """The run's session, created now; the lock goes if it cannot be."""
        context = self._context
        try:
            return await context.store.get_or_create_session(
                session_id, principal, stateless=options.stateless
            )
        except BaseException as exc:
            await context.bus.locks.release(lease)
            if isinstance(exc, SessionOwnedByOther):  # created by someone else meanwhile
                raise NotFound(f"no session {session_id!r}") from None
            raise

    async def _launch(self, handle: RunHandle) -> asyncio.Task[None]:
        """Wait for a slot (unless background), then record the run and open its log (unless
        its lease came with it); the record's write, still going on."""
        context = self._context
        ticket = handle.ticket
        if not handle.options.background and not ticket.granted:
            try:
                await ticket.wait(context.queue_timeout)
            except AdmissionRejected as exc:
                if exc.reason != "aborted":
                    context.reject(exc.reason)
                    raise admission_problem(exc) from None
                # cancelled while queued: start, and end at once as cancelled
        if ticket.granted:
            handle.status = "running"
            handle.started_at = now()
        # a run that starts now is resumable from its first write: its record carries its
        # first checkpoint (one transaction, not two)
        first = first_with_record(context, handle)
        recorded = self._records.create(handle, context.webhook_url(handle), first)
        if not handle.opened:
            await context.bus.open_run(
                handle.run_id, session_id=handle.session_id, fence=handle.lease.token
            )
        return recorded

    def shed(self) -> ServiceError | None:
        """The 429 any new run gets right now, whoever asks (counted as a rejection); else
        None. Cheap enough to ask before a request is even parsed."""
        context = self._context
        admission = context.admission
        if context.draining or admission.closed_reason is not None or not admission.full:
            return None
        context.reject("overloaded")
        return admission_problem(admission.overloaded())


def draining_problem() -> ServiceError:
    """The answer to a run start while this worker drains."""
    return Draining(
        "this server is shutting down and takes no new runs; retry on another instance",
        retry_after=_RETRY_AFTER_DRAINING,
    )


def admission_problem(exc: AdmissionRejected) -> ServiceError:
    """The answer to a run start that admission refused."""
    if exc.reason == "draining":
        return draining_problem()
    return Overloaded(str(exc), retry_after=_RETRY_AFTER_BUSY)


async def _release(hold: BudgetHold | None) -> None:
    """Give a start's reservation back (the start was refused or undone)."""
    if hold is not None:
        await hold.release()
