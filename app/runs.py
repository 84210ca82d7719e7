"""The run manager: starts runs, owns their event logs, cancels them, drains them.

A run is decoupled from the HTTP response that started it::

    start()  session (store) → session lock (bus) → admission ticket → run record + event log
       └─ task: _execute()
            wait for a slot (background runs) → load the conversation → agent.stream(...)
            every AgentEvent → wire event (seq, JSON once) → the run's event log
            the runtime's terminal event (or our own, for a run cut short before or around
            the runtime) → store the messages and the run → release lock and slot →
            append the one terminal wire event, which seals the log

Responses only read the log, each from its own cursor (``app.api.streaming``). Exactly one
terminal event is appended per run, always last: every path out of ``_execute`` goes through
``_finalize``, which appends it once.

Cancelling: a run inside the runtime is cancelled with ``agent.cancel_run`` (the runtime tells
its extensions and yields ``run.cancelled``); a run not yet there (queued, loading its
conversation) has its task cancelled. The first reason given wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

from agent_runtime.agent import AgentCore, AgentRunConfig
from agent_runtime.errors import AgentClosedError, RunError
from agent_runtime.events import AgentEvent, AgentEventType, AgentPhase
from agent_runtime.extensions.external import ExternalEvent
from agent_runtime.messages import message_from_dict, message_to_dict
from app.admission import Admission, AdmissionRejected, QueueTimeout
from app.agents import AgentProfile
from app.bus.base import Bus, BusError, BusUnavailable, LeaseLost, LogNotFound, WireEvent
from app.errors import Draining, NotFound, Overloaded, ServiceError, SessionBusy
from app.metrics import Metrics
from app.run_handle import (
    CANCEL_REASONS,
    Outcome,
    RunHandle,
    RunRequestOptions,
    new_run_id,
    now,
    record_view,
)
from app.storage import (
    RunRecord,
    RunStatus,
    SessionNotFound,
    SessionOwnedByOther,
    StorageUnavailable,
    Store,
)
from app.wire import WireEncoder, delta_json, encode_data

__all__ = ["RunHandle", "RunManager", "RunRequestOptions", "record_view"]

logger = logging.getLogger("app.runs")

_WAITING_EVENT = "confirmation_requested"
_TERMINAL_TYPES = frozenset(
    {AgentEventType.RUN_COMPLETED, AgentEventType.RUN_FAILED, AgentEventType.RUN_CANCELLED}
)
_RETRY_AFTER_BUSY = 1.0
_RETRY_AFTER_DRAINING = 5.0
# after the drain deadline, how long cancelled runs get to deliver their terminal event
_CANCEL_GRACE = 10.0


class RunManager:
    """Runs of one worker. Also the bus's ``CommandHandler`` for this worker."""

    def __init__(
        self,
        *,
        agent: AgentCore,
        store: Store,
        bus: Bus,
        admission: Admission,
        metrics: Metrics,
        profiles: Mapping[str, AgentProfile],
        agents: Mapping[str, AgentCore] | None = None,
        queue_timeout: float,
        lease_seconds: float,
        debug: bool = False,
    ) -> None:
        self._agent = agent
        self._store = store
        self._bus = bus
        self._events = bus.events
        # the in-process log appends without a coroutine; others are awaited
        self._append_nowait = getattr(bus.events, "append_nowait", None)
        self._admission = admission
        self._metrics = metrics
        self._profiles = dict(profiles)
        # each configured agent's own core; a profile without one runs on ``agent``
        self._agents = dict(agents or {})
        self._queue_timeout = queue_timeout
        self._lease_seconds = lease_seconds
        # A dead worker's runs must end within lease_seconds of its death: the lease lapses
        # 2/3 of the way there at the latest, and the sweep, every 1/6, notices it by 5/6.
        self._lease_ttl = lease_seconds * 2 / 3
        self._debug = debug
        self._runs: dict[str, RunHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._drain_task: asyncio.Task[None] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self.draining = False
        self._open_streams = 0
        self.open_waiters = 0
        bus.router.bind(self)
        if bus.shared:
            self._renewer = asyncio.get_running_loop().create_task(self._maintain())

    # --- queries ----------------------------------------------------------------------------

    @property
    def agent(self) -> AgentCore:
        """The worker's agent."""
        return self._agent

    def agent_for(self, handle: RunHandle) -> AgentCore:
        """The core that runs the handle's agent."""
        return self._agents.get(handle.profile.name, self._agent)

    def _all_agents(self) -> list[AgentCore]:
        return list({id(a): a for a in (self._agent, *self._agents.values())}.values())

    def local(self, run_id: str) -> RunHandle | None:
        """The run if this worker holds it."""
        return self._runs.get(run_id)

    def live_status(self, handle: RunHandle) -> RunStatus:
        """The handle's status, ``waiting`` while the runtime waits for an answer."""
        status = handle.status
        if status == "running" and handle.in_runtime:
            context = self.agent_for(handle).active_runs.get(handle.run_id)
            if context is not None and context.phase is AgentPhase.WAITING:
                return "waiting"
        return status

    def handle_view(self, handle: RunHandle) -> dict[str, Any]:
        """``GET /v1/runs/{id}`` for a run held here."""
        return handle.view(self.live_status(handle))

    async def find(self, run_id: str, principal: str) -> RunHandle | RunRecord | None:
        """The run (held here, else stored) if it exists and belongs to ``principal``."""
        handle = self._runs.get(run_id)
        if handle is not None:
            return handle if handle.principal == principal else None
        record = await self._store.get_run(run_id)
        if record is None or record.principal != principal:
            return None
        return record

    def stream_opened(self) -> None:
        """An SSE response started reading a log."""
        self._open_streams += 1
        self._metrics.sse_streams.inc()

    def stream_closed(self) -> None:
        """An SSE response ended."""
        self._open_streams -= 1
        self._metrics.sse_streams.dec()

    def debug_state(self) -> dict[str, Any]:
        """Counts of everything a run holds, for leak checks."""
        extensions: dict[str, dict[str, int]] = {}
        agents = self._all_agents()
        for extension in (ext for agent in agents for ext in agent.extensions):
            pending = getattr(extension, "pending_count", None)
            staged = getattr(extension, "staged_count", None)
            if callable(pending) or callable(staged):
                counts = extensions.setdefault(extension.name, {"pending": 0, "staged": 0})
                counts["pending"] += int(pending()) if callable(pending) else 0
                counts["staged"] += int(staged()) if callable(staged) else 0
        return {
            "runs": len(self._runs),
            "tasks": sum(1 for task in self._tasks if not task.done()),
            "sse_streams": self._open_streams,
            "blocking_waiters": self.open_waiters,
            "admission_running": self._admission.running,
            "admission_queued": self._admission.queued,
            "admission_principals": self._admission.principals,
            "agent_active_runs": sum(len(a.active_runs) for a in agents),
            "agent_active_sessions": sum(len(a.active_sessions) for a in agents),
            "extensions": extensions,
            "draining": self.draining,
            **self._bus.stats(),
        }

    # --- starting ---------------------------------------------------------------------------

    def profile(self, name: str) -> AgentProfile:
        """The configured agent ``name``; a 404 problem if there is none."""
        profile = self._profiles.get(name)
        if profile is None:
            raise NotFound(f"no agent {name!r}; configured: {', '.join(sorted(self._profiles))}")
        return profile

    async def start(self, principal: str, session_id: str, options: RunRequestOptions) -> RunHandle:
        """Admit and start a run; raises ``NotFound``, ``SessionBusy``, ``Overloaded``,
        ``Draining`` (``app.errors``).

        A background run is started at once, waiting for its slot in its own task; any other
        run is started only once it holds a slot (up to the queue timeout, else 429).
        """
        profile = self.profile(options.agent)
        if self.draining:
            self._reject("draining")
            raise self._draining_problem()
        # admission first: it is in memory, so a refused request (429) costs no storage write
        # and leaves no session behind, which keeps refusals fast under overload
        try:
            ticket = self._admission.reserve(principal)
        except AdmissionRejected as exc:
            self._reject(exc.reason)
            raise self._admission_problem(exc) from None
        try:
            try:
                session = await self._store.get_or_create_session(session_id, principal)
            except SessionOwnedByOther:
                raise NotFound(f"no session {session_id!r}") from None
            run_id = new_run_id()
            lease = await self._bus.locks.acquire(session_id, run_id, self._lease_ttl)
            if lease is None:
                self._reject("session_busy")
                active = await self._bus.locks.holder(session_id)
                if active is not None and not active.startswith("run_"):
                    active = None  # held for a moment by a deletion or the lost-run sweep
                raise SessionBusy(
                    f"session {session_id!r} already has an active run; wait for it to finish "
                    "or cancel it",
                    extra={"active_run_id": active},
                )
        except BaseException:
            ticket.release()
            raise
        handle = RunHandle(run_id, session_id, principal, profile, options, lease, ticket)
        handle.history_size = session.message_count
        self._runs[run_id] = handle
        self._idle.clear()
        loop = asyncio.get_running_loop()
        try:
            if not options.background and not ticket.granted:
                try:
                    await ticket.wait(self._queue_timeout)
                except AdmissionRejected as exc:
                    if exc.reason != "aborted":
                        self._reject(exc.reason)
                        raise self._admission_problem(exc) from None
                    # cancelled while queued: start, and end at once as cancelled
            if ticket.granted:
                handle.status = "running"
                handle.started_at = now()
            # The record is written while the run starts (its model call is usually what
            # the first event waits for); this request answers only once it is stored, and
            # the run awaits it before its own first write.
            handle.recorded = loop.create_task(
                self._create_record(
                    RunRecord(
                        run_id=run_id,
                        session_id=session_id,
                        principal=principal,
                        agent=profile.name,
                        input=options.input,
                        status=handle.status,
                        created_at=handle.created_at,
                        started_at=handle.started_at,
                        metadata=handle.metadata,
                    )
                )
            )
            await self._events.create(run_id, session_id=session_id, fence=lease.token)
            await self._bus.router.register(run_id, session_id)
        except BaseException:
            await self._abandon(handle)
            raise
        task = loop.create_task(self._execute(handle), name=run_id)
        handle.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.shield(handle.recorded)
        except asyncio.CancelledError:
            self.cancel_local(run_id, "client_disconnected")  # the request went away
            raise
        except BaseException:
            # not stored (session deleted meanwhile, or the store failed): nobody will learn
            # this run's id, so end it; it stores nothing more (see _record_stored)
            self.cancel_local(run_id, "cancel_requested")
            raise
        logger.info(
            "run accepted",
            extra={
                "run_id": run_id,
                "session_id": session_id,
                "principal": principal,
                "agent": profile.name,
                "status": handle.status,
                **({"input": options.input} if self._debug else {}),
            },
        )
        return handle

    async def _create_record(self, record: RunRecord) -> None:
        try:
            await self._store.create_run(record)
        except SessionNotFound:
            # deleted between the ownership check and the lock
            raise NotFound(f"no session {record.session_id!r}") from None
        except SessionOwnedByOther:  # deleted, then re-created by someone else
            raise NotFound(f"no session {record.session_id!r}") from None

    async def _abandon(self, handle: RunHandle) -> None:
        """Undo a start that failed before the run's task existed."""
        self._runs.pop(handle.run_id, None)
        if not self._runs:
            self._idle.set()
        handle.ticket.release()
        with contextlib.suppress(Exception):
            await self._bus.locks.release(handle.lease)
        discard = getattr(self._events, "discard", None)
        if callable(discard):
            discard(handle.run_id)
        if await self._record_stored(handle):
            with contextlib.suppress(Exception):
                await self._store.update_run(
                    handle.run_id,
                    status="failed",
                    error={"code": "internal", "message": "the run could not be started"},
                )
        if not handle.finished.done():
            handle.finished.set_result(None)

    async def _record_stored(self, handle: RunHandle) -> bool:
        """Wait for the run's record to be written; False if it was not (start() says why)."""
        recorded = handle.recorded
        if recorded is None:
            return False
        if not recorded.done():
            await asyncio.wait([recorded])
        return not recorded.cancelled() and recorded.exception() is None

    def shed(self) -> ServiceError | None:
        """The 429 any new run gets right now, whoever asks (counted as a rejection); else
        None. Cheap enough to ask before a request is even parsed."""
        admission = self._admission
        if self.draining or admission.closed_reason is not None or not admission.full:
            return None
        self._reject("overloaded")
        return self._admission_problem(admission.overloaded())

    def _reject(self, reason: str) -> None:
        self._metrics.runs_rejected.labels(reason).inc()

    def _draining_problem(self) -> ServiceError:
        return Draining(
            "this server is shutting down and takes no new runs; retry on another instance",
            retry_after=_RETRY_AFTER_DRAINING,
        )

    def _admission_problem(self, exc: AdmissionRejected) -> ServiceError:
        if exc.reason == "draining":
            return self._draining_problem()
        return Overloaded(str(exc), retry_after=_RETRY_AFTER_BUSY)

    # --- executing --------------------------------------------------------------------------

    async def _execute(self, handle: RunHandle) -> None:
        outcome: Outcome | None = None
        try:
            if not handle.ticket.granted and handle.cancel_reason is None:
                remaining = self._queue_timeout - (time.monotonic() - handle.t_accepted)
                try:
                    await handle.ticket.wait(max(0.0, remaining))
                except QueueTimeout as exc:
                    outcome = Outcome.failed("queue_timeout", str(exc))
                except AdmissionRejected as exc:
                    reason = "shutdown" if exc.reason == "draining" else "cancel_requested"
                    outcome = Outcome.cancelled(handle.cancel_reason or reason)
            if outcome is None:
                if handle.cancel_reason is not None:
                    outcome = Outcome.cancelled(handle.cancel_reason)
                else:
                    outcome = await self._drive(handle)
        except asyncio.CancelledError:
            # only this manager cancels a run's task (a run not yet in the runtime); the
            # terminal event must still go out, so finalize shielded, then propagate
            if not handle.finalizing:
                cancelled = Outcome.cancelled(handle.cancel_reason or "shutdown")
                await asyncio.shield(self._finalize(handle, cancelled))
            raise
        except BusError as exc:
            # the shared bus failed under the run: Redis unreachable, or the lease taken over
            logger.error("run stopped by a bus failure: %s", exc, extra={"run_id": handle.run_id})
            outcome = _bus_failure(exc)
        except Exception:
            logger.exception("run failed unexpectedly", extra={"run_id": handle.run_id})
            outcome = Outcome.failed("internal", "the run failed unexpectedly; it was logged")
        await self._finalize(handle, outcome)

    async def _drive(self, handle: RunHandle) -> Outcome:
        """Run the agent and forward its events; the outcome of its terminal event."""
        run_id = handle.run_id
        # a new session has nothing to read back: skip the query on the way to the first event
        stored = await self._store.list_messages(handle.session_id) if handle.history_size else []
        history = [message_from_dict(item.message) for item in stored]
        if handle.status == "queued":
            handle.status = "running"
            handle.started_at = now()
            await self._update_status(handle, "running")
        options = handle.profile.run_options()
        if handle.options.system_prompt is not None:
            options["system_prompt"] = handle.options.system_prompt
        run_timeout = handle.options.run_timeout or handle.profile.run_timeout
        if run_timeout is not None:
            options["run_timeout"] = run_timeout
        max_iterations = handle.options.max_iterations or handle.profile.max_iterations
        if max_iterations is not None:
            options["max_iterations"] = max_iterations
        config = AgentRunConfig(
            session_id=handle.session_id,
            request_id=run_id,
            run_id=run_id,
            metadata=handle.metadata,
        )
        terminal: AgentEvent | None = None
        encode = handle.encoder.encode_json
        text_delta = AgentEventType.TEXT_DELTA
        append_nowait = self._append_nowait
        events = self._events
        fence = handle.lease.token
        usage = handle.usage
        handle.in_runtime = True
        try:
            stream = cast(
                AsyncGenerator[AgentEvent, None],
                self.agent_for(handle).stream(
                    handle.input, config=config, conversation=history, **options
                ),
            )
            try:
                async for event in stream:
                    # the hot path: one encode, one append
                    event_type = event.type
                    seq = handle.seq + 1
                    if event_type is text_delta:
                        wire = encode(seq, "text.delta", event.ts, delta_json(event.delta))
                    elif event_type in _TERMINAL_TYPES:
                        terminal = event
                        continue
                    else:
                        wire = encode(seq, event_type.value, event.ts, encode_data(event.data()))
                    handle.seq = seq
                    if append_nowait is not None:
                        append_nowait(run_id, wire, fence=fence)
                    else:
                        await events.append(run_id, wire, fence=fence)
                    if handle.t_first_event is None:
                        handle.t_first_event = time.monotonic()
                        self._metrics.time_to_first_event.observe(
                            handle.t_first_event - handle.t_accepted
                        )
                    if event_type is AgentEventType.USAGE:
                        usage.add(event.usage)
                    elif event_type is AgentEventType.CUSTOM and event.name == _WAITING_EVENT:
                        handle.status = "waiting"
                        await self._update_status(handle, "waiting")
                    elif handle.status == "waiting":
                        handle.status = "running"
                        await self._update_status(handle, "running")
            except RunError:
                pass  # run.failed or run.cancelled was yielded just before
            finally:
                await stream.aclose()
        except AgentClosedError:
            return Outcome.cancelled(handle.cancel_reason or "shutdown")
        finally:
            handle.in_runtime = False
        if terminal is None:  # pragma: no cover - the runtime always ends with a terminal event
            return Outcome.failed("internal", "the run ended without a result")
        return self._outcome_of(handle, terminal)

    def _outcome_of(self, handle: RunHandle, event: AgentEvent) -> Outcome:
        data = event.data()
        if event.type is AgentEventType.RUN_COMPLETED:
            if event.usage is not None:
                handle.usage = event.usage
            return Outcome(
                "completed",
                "run.completed",
                data,
                output=data["output"],
                messages=list(event.messages or ()),
            )
        if event.type is AgentEventType.RUN_FAILED:
            if event.usage is not None:
                handle.usage = event.usage
            error = dict(data["error"])
            return Outcome("failed", "run.failed", {"error": error}, error=error)
        reason = handle.cancel_reason or event.reason or "cancel_requested"
        if reason not in CANCEL_REASONS:
            # the runtime's own words for a cancellation we did not ask for
            reason = "shutdown" if self.agent_for(handle).closed else "cancel_requested"
        return Outcome.cancelled(reason)

    async def _update_status(self, handle: RunHandle, status: RunStatus) -> None:
        if not await self._record_stored(handle):
            return
        try:
            await self._store.update_run(handle.run_id, status=status)
        except Exception:
            logger.warning(
                "could not store the run's status",
                exc_info=True,
                extra={"run_id": handle.run_id, "status": status},
            )

    async def _finalize(self, handle: RunHandle, outcome: Outcome) -> None:
        """Store the outcome, release the run's hold, append its one terminal event."""
        if handle.finalizing:  # pragma: no cover - guarded by the callers
            return
        handle.finalizing = True
        run_id = handle.run_id
        stored = await self._record_stored(handle)
        if stored and outcome.status == "completed" and outcome.messages:
            try:
                await self._store.append_messages(
                    handle.session_id, run_id, [message_to_dict(m) for m in outcome.messages]
                )
            except Exception:
                logger.exception("could not store the run's messages", extra={"run_id": run_id})
                outcome = Outcome.failed(
                    "internal", "the run completed but its messages could not be stored"
                )
        handle.status = outcome.status
        handle.output = outcome.output
        handle.error = outcome.error
        handle.finished_at = now()
        try:
            if stored:
                await self._store.update_run(
                    run_id,
                    status=outcome.status,
                    output=outcome.output,
                    error=outcome.error,
                    usage=handle.usage.to_dict(),
                )
        except Exception:
            logger.exception("could not store the run's outcome", extra={"run_id": run_id})
        handle.ticket.release()
        # the terminal event before the lock's release: a worker dying in between leaves a
        # sealed log and a lock that lapses, never an unsealed log. Yet a client that starts
        # the next run as soon as it reads this one's end must not find the session busy: a
        # shared bus releases the lock in the same step as the sealing append, the
        # in-process one just below without a suspension point in between.
        handle.seq += 1
        wire = handle.encoder.encode(handle.seq, outcome.event_type, time.time(), outcome.data)
        try:
            await self._events.append(run_id, wire, fence=handle.lease.token)
        except BusError:
            logger.exception("could not append the terminal event", extra={"run_id": run_id})
        try:
            await self._bus.locks.release(handle.lease)
            await self._bus.router.unregister(run_id)
        except Exception:
            logger.exception("could not release the run's session lock", extra={"run_id": run_id})
        self._runs.pop(run_id, None)
        if not self._runs:
            self._idle.set()
        elapsed = time.monotonic() - handle.t_accepted
        self._metrics.runs_total.labels(outcome.status).inc()
        self._metrics.run_duration.labels(outcome.status).observe(elapsed)
        handle.finished.set_result(None)
        details: dict[str, Any] = {
            "run_id": run_id,
            "session_id": handle.session_id,
            "status": outcome.status,
            "duration_ms": round(elapsed * 1000),
            "events": handle.seq,
        }
        if outcome.error is not None:
            details["code"] = outcome.error.get("code")
        if outcome.status == "cancelled":
            details["reason"] = outcome.data.get("reason")
        logger.info("run finished", extra=details)

    # --- commands ---------------------------------------------------------------------------

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held here; False if there is no such unfinished run."""
        handle = self._runs.get(run_id)
        if handle is None or handle.done:
            return False
        if handle.finalizing:  # its terminal event is being written: too late to change it
            return True
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
        if handle.in_runtime:
            # False means the runtime's run already ended: its terminal event is on its way
            self.agent_for(handle).cancel_run(run_id, handle.cancel_reason)
            return True
        task = handle.task
        if task is None:  # still in start(): queued, or storing its record
            handle.ticket.abort()
            return True
        if not handle.task_cancelled:
            handle.task_cancelled = True
            task.cancel()
        return True

    def deliver_local(
        self, session_id: str, run_id: str | None, name: str, payload: Mapping[str, Any]
    ) -> list[str]:
        """Offer an external answer to the agent holding the run (found by run, else session)."""
        event = ExternalEvent(name, dict(payload))
        config = AgentRunConfig(session_id=session_id, request_id=run_id)
        handle = self._runs.get(run_id) if run_id is not None else None
        if handle is None:
            handle = next((h for h in self._runs.values() if h.session_id == session_id), None)
        # no run here: any agent's extension may still hold it (they check session and run)
        agents = [self.agent_for(handle)] if handle is not None else self._all_agents()
        for agent in agents:
            try:
                accepted = agent.emit_external_event(event, config=config)
            except AgentClosedError:
                continue
            if accepted:
                return accepted
        return []

    async def cancel(self, run_id: str, principal: str) -> tuple[str, RunStatus] | None:
        """``POST /v1/runs/{id}/cancel``: ("cancelling" | "finished", status), None if unknown."""
        found = await self.find(run_id, principal)
        if found is None:
            return None
        if isinstance(found, RunHandle):
            if found.finalizing and not found.done:
                # its outcome is being stored: answer with it, not with "running" (shielded: a
                # client that leaves must not cancel the run's own future)
                await asyncio.shield(found.finished)
            if found.done or found.finalizing:
                return "finished", found.status
            self.cancel_local(run_id, "cancel_requested")
            return "cancelling", self.live_status(found)
        if found.is_finished:
            return "finished", found.status
        if not await self._bus.router.cancel(run_id, "cancel_requested"):
            # no worker holds it: it has just ended, or its worker is lost (the sweep ends it)
            record = await self._store.get_run(run_id)
            if record is not None and record.is_finished:
                return "finished", record.status
        return "cancelling", found.status

    async def external_event(
        self,
        principal: str,
        session_id: str,
        run_id: str | None,
        name: str,
        payload: Mapping[str, Any],
    ) -> list[str]:
        """Deliver an answer to a waiting run of the caller's session; 404 if not theirs."""
        local = self._runs.get(run_id) if run_id is not None else None
        if local is not None and local.session_id == session_id:
            # the run is held here: its handle answers the ownership question without a query
            owned = local.principal == principal
        else:
            session = await self._store.get_session(session_id)
            owned = session is not None and session.principal == principal
        if not owned:
            self._metrics.external_events.labels("not_found").inc()
            raise NotFound(f"no session {session_id!r}")
        accepted = await self._bus.router.deliver_external(session_id, run_id, name, payload)
        self._metrics.external_events.labels("accepted" if accepted else "not_accepted").inc()
        return accepted

    # --- lifecycle --------------------------------------------------------------------------

    async def recover(self) -> int:
        """Fail runs a previous process left unfinished (one worker, no shared bus only)."""
        count = 0
        for record in await self._store.list_unfinished_runs():
            if record.run_id in self._runs:
                continue
            await self._store.update_run(
                record.run_id,
                status="failed",
                error={
                    "code": "worker_lost",
                    "message": "the server stopped before this run finished",
                },
            )
            count += 1
        if count:
            logger.warning("marked runs of a previous process as lost", extra={"count": count})
        return count

    def begin_drain(self) -> None:
        """Stop taking runs (readiness 503, new runs 503); idempotent and synchronous."""
        if not self.draining:
            self.draining = True
            self._admission.close(
                "this server is shutting down and takes no new runs; retry on another instance"
            )
            logger.info("draining", extra={"runs": len(self._runs)})

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain's own budget
        """Let runs finish for ``timeout`` seconds, then cancel the rest (reason shutdown).

        Idempotent: concurrent and later callers wait for the same drain.
        """
        self.begin_drain()
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(timeout))
        await asyncio.shield(self._drain_task)

    async def _drain(self, budget: float) -> None:
        if not await self._wait_idle(budget):
            left = list(self._runs)
            logger.warning("drain timeout: cancelling runs", extra={"runs": len(left)})
            for run_id in left:
                self.cancel_local(run_id, "shutdown")
            if not await self._wait_idle(_CANCEL_GRACE):
                logger.error("runs did not end after cancellation", extra={"runs": len(self._runs)})
        logger.info("drained")

    async def _wait_idle(self, timeout: float) -> bool:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop the lease renewer and reaper (after ``drain``)."""
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            await asyncio.wait([renewer])

    async def _maintain(self) -> None:
        """With a shared bus: renew this worker's leases, and fail other workers' lost runs."""
        interval = self._lease_seconds / 6
        rounds = 0
        while True:
            await asyncio.sleep(interval)
            await self._renew_leases()
            rounds += 1
            try:
                await self.reap_lost_runs(from_store=rounds % 6 == 0)
            except (BusUnavailable, StorageUnavailable) as exc:  # an outage: no traceback
                logger.warning("could not check for lost runs: %s", exc)
            except Exception:
                logger.warning("could not check for lost runs", exc_info=True)

    async def _renew_leases(self) -> None:
        for handle in list(self._runs.values()):
            if handle.done or handle.finalizing:
                continue
            try:
                await self._bus.locks.renew(handle.lease, self._lease_ttl)
            except LeaseLost:
                logger.error(
                    "lost the session lease of a run; stopping it", extra={"run_id": handle.run_id}
                )
                self.cancel_local(handle.run_id, "shutdown")
            except Exception:
                logger.warning(
                    "could not renew a session lease",
                    exc_info=True,
                    extra={"run_id": handle.run_id},
                )

    async def reap_lost_runs(self, *, from_store: bool = True) -> int:
        """End the runs whose worker no longer holds their session's lease.

        Candidates: unsealed logs whose run no worker holds (on a bus that lists them, every
        round) and the store's unfinished runs (``from_store``). For each, take the session's
        lock (a higher fencing token than the lost worker's), then make the log and the store
        agree on one end (``_settle``). Returns how many runs were failed as ``worker_lost``.
        Only meaningful with a shared bus, where leases expire when a worker dies.
        """
        candidates: dict[str, str] = {}
        # this worker's runs while the candidates are listed: listed as unfinished, they were
        # running here, so they are not lost (each ends through _finalize, here). Skipping them
        # without a look keeps a round cheap where most runs are local, and a run of ours that
        # ended since does not cost its reads (a later round still sees a record left
        # unfinished, by a store outage, once the run is no longer ours)
        ours = set(self._runs)
        orphans = getattr(self._events, "orphans", None)
        if callable(orphans):
            candidates.update(await orphans())
        if from_store:
            for record in await self._store.list_unfinished_runs():
                candidates.setdefault(record.run_id, record.session_id)
        ours.update(self._runs)
        locks = self._bus.locks
        reaped = 0
        for run_id, session_id in candidates.items():
            if run_id in ours or run_id in self._runs:
                continue
            if await locks.holder(session_id) == run_id:
                continue  # its worker still renews the lease
            if await self._ended(run_id):
                # it ended where it ran since the candidates were listed (its lock released
                # after both of these): taking the lock now would only make a client's next
                # run in the session find it busy
                continue
            reaper = f"reaper_{secrets.token_hex(8)}"
            lease = await locks.acquire(session_id, reaper, self._lease_ttl)
            if lease is None:
                continue  # the session is busy again; a later round decides
            try:
                if await self._settle(run_id, session_id, lease.token):
                    reaped += 1
            finally:
                await locks.release(lease)
        return reaped

    async def _ended(self, run_id: str) -> bool:
        """True if nothing is left to settle: the run's record (if any) is finished and its log
        (if any is left) holds its end."""
        record = await self._store.get_run(run_id)
        if record is not None and not record.is_finished:
            return False
        kept, end = await self._log_end(run_id)
        # no log left (expired, even while it was being read, or never made): nothing to end
        return not kept or end is not None

    async def _settle(self, run_id: str, session_id: str, fence: int) -> bool:
        """Give a run that no worker holds one end, the same in its log and in the store.

        Lost mid-way: ``run.failed`` (``worker_lost``) in both, so its readers get their
        terminal event. Its worker died between storing the end and appending it: that end
        is appended; the reverse (the store was unreachable): the logged end is stored. True
        if the run was failed as lost.
        """
        record = await self._store.get_run(run_id)
        _, logged = await self._log_end(run_id)
        if logged is not None:
            if record is not None and not record.is_finished:
                data = logged.document["data"]
                if logged.type == "run.completed":
                    await self._store.update_run(
                        run_id,
                        status="completed",
                        output=data.get("output"),
                        usage=data.get("usage"),
                    )
                elif logged.type == "run.failed":
                    await self._store.update_run(run_id, status="failed", error=data.get("error"))
                else:
                    await self._store.update_run(run_id, status="cancelled")
            return False
        if record is not None and record.is_finished:
            if record.status == "completed":
                completed = {"output": record.output, "usage": record.usage or {}}
                await self._append_end(run_id, session_id, "run.completed", completed, fence)
            elif record.status == "failed":
                await self._append_end(
                    run_id, session_id, "run.failed", {"error": record.error}, fence
                )
            else:  # the reason of a cancellation is not stored
                await self._append_end(
                    run_id, session_id, "run.cancelled", {"reason": "shutdown"}, fence
                )
            return False
        error = {
            "code": "worker_lost",
            "message": "the worker running this run stopped before it finished",
        }
        # stored first: a reader that gets the terminal event finds the run ended
        if record is not None:
            await self._store.update_run(run_id, status="failed", error=error)
        await self._append_end(run_id, session_id, "run.failed", {"error": error}, fence)
        logger.warning("run lost with its worker", extra={"run_id": run_id})
        return True

    async def _log_end(self, run_id: str) -> tuple[bool, WireEvent | None]:
        """Whether the run's log is still kept, and its terminal event if it has one.

        A sealed log expires its TTL after the run's end, possibly between two of these reads:
        a log found gone at any of them counts as not kept, never as one without an end.
        """
        last = await self._events.last_seq(run_id)
        if last is None:
            return False, None
        if last == 0:
            return True, None
        try:
            subscription = await self._events.subscribe(run_id, after=last - 1)
        except LogNotFound:
            return False, None
        try:
            async with asyncio.timeout(10):
                batch = await subscription.next()
        finally:
            await subscription.aclose()
        if batch and batch[-1].terminal:
            return True, batch[-1]
        return True, None

    async def _append_end(
        self, run_id: str, session_id: str, type_: str, data: dict[str, Any], fence: int
    ) -> None:
        last = await self._events.last_seq(run_id)
        if last is None:
            return  # no log (never created, or expired): the store alone tells
        wire = WireEncoder(run_id, session_id).encode(last + 1, type_, time.time(), data)
        try:
            await self._events.append(run_id, wire, fence=fence)
        except BusError:
            logger.warning("could not end a lost run's log", extra={"run_id": run_id})


def _bus_failure(exc: BusError) -> Outcome:
    """How a run ends when the bus fails under it (the details go to the log, not the client)."""
    if isinstance(exc, LeaseLost):
        return Outcome.failed(
            "worker_lost", "this worker lost the run's session lease; the run was ended"
        )
    if isinstance(exc, BusUnavailable):
        return Outcome.failed(
            "unavailable", "the shared event bus (Redis) became unreachable during the run"
        )
    return Outcome.failed("internal", "the run's event log refused an event; it was logged")
