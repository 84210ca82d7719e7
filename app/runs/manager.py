"""The run manager: one worker's runs, behind one object the HTTP layer and the bus talk to.

It holds no logic of its own beyond the queries; each concept is a module of this package::

    start.py      admission and start: slot, session, lease, record, log, the run's task
    driver.py     the run's task: agent events → wire events → the run's log
    records.py    every write of a run's record to the store
    finalize.py   the run's one end: outcome stored, hold released, terminal event appended
    routing.py    cancels and answers, here or through the bus (the CommandHandler side)
    stopping.py   stopping a run held here, through the runtime or by its task
    multitask.py  a start while the session is busy: reject, enqueue, interrupt, rollback
    leases.py     renewing this worker's leases, the deadline watchdog, running the sweep
    fencing.py    each run's lease deadline, and fencing a run off when it passes
    sweep.py      runs no worker holds any more: the lost-run sweep, recovery at start
    checkpoints.py  the run's checkpoint sink: each checkpoint stored, fenced, with its seq
    resume.py     resume instead of worker_lost: a lapsed run taken over from its checkpoint
    drain.py      shutdown: stop taking runs, let them finish, hand over or stop the rest
    handover.py   parking a run at shutdown (or fenced off) so another worker resumes it
    idempotency.py  Idempotency-Key claims: a repeated start attaches to the first run
    grace.py      the disconnect grace of on_disconnect=cancel; readers that re-attach
    context.py    what they share: the dependencies and the table of held runs

A run is decoupled from the HTTP response that started it: responses only read its log, each
from its own cursor (``app.http.api.streaming``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agent_runtime.agent import AgentCore
from app.admission.budgets import Budgets
from app.admission.slots import Admission
from app.agents.build import AgentProfile
from app.bus.base import Bus
from app.errors import ServiceError, WebhookRefused
from app.runs.context import RunContext
from app.runs.drain import Drain
from app.runs.driver import Driver
from app.runs.fencing import Fencing
from app.runs.final_write import FinalWrites
from app.runs.finalize import Finalizer
from app.runs.grace import DisconnectGrace
from app.runs.handle import RunHandle, RunRequestOptions
from app.runs.handover import HandOver
from app.runs.idempotency import IdempotentStarts
from app.runs.leases import LeaseKeeper
from app.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from app.webhooks.hooks import RunWebhooks
from app.runs.multitask import Multitask, QueuedRun, session_queue
from app.runs.records import RunRecords
from app.runs.resume import Resumer
from app.runs.routing import Routing
from app.runs.start import Starter
from app.runs.stopping import RunStopper
from app.runs.sweep import LostRunSweep
from app.storage import RunRecord, RunStatus, Store
from app.telemetry.tracing import Tracing

__all__ = ["RunManager"]

logger = logging.getLogger("app.runs")


class RunManager:
    """Runs of one worker; its ``routing`` is the bus's ``CommandHandler`` for this worker."""

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
        max_session_queue: int = 8,
        debug: bool = False,
        unavailable: Callable[[str], str | None] | None = None,
        budgets: Budgets | None = None,
        clock: Callable[[], float] = time.monotonic,
        keep_leases: bool = True,
        disconnect_grace: float = 0.0,
        idempotency_ttl: float = 86_400.0,
        tracing: Tracing | None = None,
        webhooks: RunWebhooks | None = None,
        resume_runs: bool = False,
        max_resumes: int = 3,
        hand_over: bool = False,
        reader_refresh: float = 15.0,
    ) -> None:
        """``clock``: the monotonic clock of the runs' lease deadlines; ``keep_leases``:
        whether a shared bus's leases are renewed and watched in the background (tests
        that drive the rounds themselves turn it off; see ``leases``)."""
        context = RunContext(
            agent=agent,
            agents=agents or {},
            store=store,
            bus=bus,
            admission=admission,
            metrics=metrics,
            profiles=profiles,
            queue_timeout=queue_timeout,
            lease_seconds=lease_seconds,
            debug=debug,
            unavailable=unavailable,
            budgets=budgets,
            clock=clock,
            tracing=tracing,
            webhooks=webhooks,
            resume_runs=resume_runs,
            max_resumes=max_resumes,
            hand_over=hand_over,
        )
        self._context = context
        records = RunRecords(store, metrics)
        self._writes = FinalWrites(context)
        handover = HandOver(context)
        finalizer = Finalizer(context, records, self._writes, handover)
        stopper = RunStopper(context)
        self.fencing = Fencing(context, stopper)
        driver = Driver(context, records, finalizer, self.fencing)
        self._grace = DisconnectGrace(context, stopper, disconnect_grace, reader_refresh)
        resumer = Resumer(context, driver, self.fencing, self._grace)
        self._sweep = LostRunSweep(context, resumer)
        # public: the bus (its CommandHandler) and the answering edges reach it directly
        self.routing = Routing(context, stopper, self._sweep.resume_parked)
        # the multitask strategies start the runs they queue with the starter's own start
        multitask = functools.partial(
            Multitask, context, session_queue(bus), max_queue=max_session_queue
        )
        self._starter = Starter(
            context, records, driver, finalizer, stopper, self.fencing, self._writes, busy=multitask
        )
        self._multitask = self._starter.busy
        self.leases = LeaseKeeper(context, self.fencing, self._sweep)
        self._drain = Drain(context, stopper, self._writes, handover)
        self.idempotency = _idempotent_starts(bus, idempotency_ttl, queue_timeout)
        self._open_streams = 0
        # blocking (stream: false) responses waiting for their run; counted by the response
        self.open_waiters = 0
        bus.router.bind(self.routing)
        if bus.shared and keep_leases:
            self.leases.start()

    # --- queries ----------------------------------------------------------------------------

    @property
    def unwritten_ends(self) -> int:
        """Runs ended here whose final write waits for the store (``app.runs.final_write``)."""
        return len(self._writes)

    @property
    def agent(self) -> AgentCore:
        """The worker's agent."""
        return self._context.agent

    @property
    def draining(self) -> bool:
        """True once the drain began: no new runs."""
        return self._context.draining

    def agent_for(self, handle: RunHandle) -> AgentCore:
        """The core that runs the handle's agent."""
        return self._context.agent_for(handle)

    def drained(self) -> asyncio.Future[None]:
        """Resolved once this worker's drain is over; the streams it serves then end without
        a terminal event, and their clients resume with ``Last-Event-ID`` elsewhere."""
        return self._context.drained()

    def local(self, run_id: str) -> RunHandle | None:
        """The run if this worker holds it."""
        return self._context.runs.get(run_id)

    def live_status(self, handle: RunHandle) -> RunStatus:
        """The handle's status, ``waiting`` while the runtime waits for an answer."""
        return self._context.live_status(handle)

    def handle_view(self, handle: RunHandle) -> dict[str, Any]:
        """``GET /v1/runs/{id}`` for a run held here."""
        return handle.view(self._context.live_status(handle))

    async def find(
        self, run_id: str, principal: str, session_id: str | None = None
    ) -> RunHandle | RunRecord | None:
        """The run (held here, else stored) if it exists and belongs to ``principal`` (and,
        given ``session_id``, to that session): ``RunContext.find``."""
        return await self._context.find(run_id, principal, session_id)

    def stream_opened(self) -> None:
        """An SSE response started reading a log."""
        self._open_streams += 1
        self._context.metrics.sse_streams.inc()

    def stream_closed(self) -> None:
        """An SSE response ended."""
        self._open_streams -= 1
        self._context.metrics.sse_streams.dec()

    def debug_state(self) -> dict[str, Any]:
        """Counts of everything a run holds, for leak checks."""
        context = self._context
        extensions: dict[str, dict[str, int]] = {}
        agents = context.all_agents()
        for extension in (ext for agent in agents for ext in agent.extensions):
            pending = getattr(extension, "pending_count", None)
            staged = getattr(extension, "staged_count", None)
            if callable(pending) or callable(staged):
                counts = extensions.setdefault(extension.name, {"pending": 0, "staged": 0})
                counts["pending"] += int(pending()) if callable(pending) else 0
                counts["staged"] += int(staged()) if callable(staged) else 0
        admission = context.admission
        return {
            "runs": len(context.runs),
            "tasks": sum(1 for task in context.tasks if not task.done()),
            "sse_streams": self._open_streams,
            "blocking_waiters": self.open_waiters,
            "admission_running": admission.running,
            "admission_queued": admission.queued,
            "admission_principals": admission.principals,
            "agent_active_runs": sum(len(a.active_runs) for a in agents),
            "agent_active_sessions": sum(len(a.active_sessions) for a in agents),
            "extensions": extensions,
            "draining": context.draining,
            "grace_timers": self._grace.pending,
            # runs ended while the store was out, their final write still retried
            "unwritten_ends": len(self._writes),
            "session_queued": self._multitask.waiting,
            **context.bus.stats(),
        }

    # --- starting ---------------------------------------------------------------------------

    def profile(self, name: str) -> AgentProfile:
        """The configured agent ``name``; ``NotFound`` if there is none."""
        return self._starter.profile(name)

    async def start(self, principal: str, session_id: str, options: RunRequestOptions) -> RunHandle:
        """Admit and start a run; raises ``NotFound``, ``SessionBusy``, ``Overloaded``,
        ``Draining`` (``app.errors``).

        A background run is started at once, waiting for its slot in its own task; any other
        run is started only once it holds a slot (up to the queue timeout, else 429). A busy
        session: 409, or the ``interrupt`` and ``rollback`` strategies; ``enqueue`` needs
        ``submit``.
        """
        return await self._starter.start(principal, session_id, options)

    async def submit(
        self, principal: str, session_id: str, options: RunRequestOptions
    ) -> RunHandle | QueuedRun:
        """``start``, with every ``multitask_strategy`` (``app.runs.multitask``): a
        background run that waits in its session's queue is answered as a ``QueuedRun``.

        A ``webhook_url`` is checked first (before a run may be queued): ``WebhookRefused``.
        """
        if options.webhook_url is not None:
            webhooks = self._context.webhooks
            if webhooks is None:
                raise WebhookRefused(
                    "webhooks are off on this server: set AGENT_WEBHOOK_SECRET to send them"
                )
            await webhooks.check(options.webhook_url)  # resolves the host, off the loop
        return await self._multitask.start(principal, session_id, options)

    async def queued_view(self, run_id: str, principal: str) -> dict[str, Any] | None:
        """``GET /v1/runs/{id}`` of the caller's run waiting in its session's queue, if it is."""
        return await self._multitask.view(run_id, principal)

    async def find_after_queue(self, run_id: str, principal: str) -> RunHandle | RunRecord | None:
        """``find``; for the caller's run still waiting in its session's queue, once it left
        the queue (started, or cancelled)."""
        if await self._multitask.view(run_id, principal) is None:
            return None
        await self._multitask.wait_dequeued(run_id)
        for _ in range(200):  # a claimed run is recorded within moments
            found = await self.find(run_id, principal)
            if found is not None:
                return found
            if await self._multitask.view(run_id, principal) is None:
                break
            await asyncio.sleep(0.05)
        return await self.find(run_id, principal)

    def shed(self) -> ServiceError | None:
        """The 429 any new run gets right now, whoever asks (counted as a rejection); else
        None. Cheap enough to ask before a request is even parsed."""
        return self._starter.shed()

    # --- readers ----------------------------------------------------------------------------

    def on_disconnect(self, run_id: str) -> Callable[[], None]:
        """``on_disconnect=cancel`` of a response of ``run_id``: cancel it after the
        disconnect grace unless another reader attached meanwhile."""
        return self._grace.policy(run_id)

    async def reader_attached(self, run_id: str) -> None:
        """A reader (re-)attached to the live run (the disconnect grace looks for it)."""
        await self._grace.attached(run_id)

    @property
    def reader_refresh(self) -> float | None:
        """How often a reader renews its attach mark (``reader_alive``); None: never."""
        return self._grace.refresh

    async def reader_alive(self, run_id: str) -> None:
        """A reader still reads the run: its mark renewed (a failure only logged: a run
        resumed elsewhere may then count the reader as gone)."""
        try:
            await self._grace.attached(run_id)
        except Exception as exc:
            logger.warning("could not renew a reader's mark of run %s: %s", run_id, exc)

    # --- commands ---------------------------------------------------------------------------

    def cancel_local(self, run_id: str, reason: str) -> bool:
        """Cancel a run held here; False if there is no such unfinished run."""
        return self.routing.cancel_local(run_id, reason)

    async def cancel(self, run_id: str, principal: str) -> tuple[str, RunStatus] | None:
        """``POST /v1/runs/{id}/cancel``: ("cancelling" | "finished", status), None if unknown."""
        answer = await self.routing.cancel(run_id, principal)
        if answer is not None:
            return answer
        answer = await self._multitask.cancel(run_id, principal)
        for _ in range(100):
            if answer is None or answer[0] != "claimed":
                return answer
            # claimed to start this very moment: cancel it as a run once it is one
            await asyncio.sleep(0.05)
            answer = await self.routing.cancel(run_id, principal)
        return "cancelling", "queued"

    # --- lifecycle --------------------------------------------------------------------------

    async def recover(self) -> int:
        """Fail runs a previous process left unfinished (one worker, no shared bus only)."""
        return await self._sweep.recover()

    async def reap_lost_runs(self, *, from_store: bool = True) -> int:
        """End the runs whose worker no longer holds their session's lease (see
        ``LostRunSweep.reap_lost_runs``); how many were failed as ``worker_lost``."""
        return await self._sweep.reap_lost_runs(from_store=from_store)

    def begin_drain(self) -> None:
        """Stop taking runs (readiness 503, new runs 503); idempotent and synchronous."""
        self._drain.begin()

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109 - the drain's own budget
        """Let runs finish for ``timeout`` seconds, then cancel the rest (reason shutdown).

        Idempotent: concurrent and later callers wait for the same drain.
        """
        await self._drain.drain(timeout)

    async def aclose(self) -> None:
        """Stop the lease renewer, sweep, grace timers and queued runs (after ``drain``)."""
        await self._sweep.aclose()
        await self._multitask.aclose()
        await self._writes.aclose()
        await self._grace.aclose()
        await self.leases.aclose()


def _idempotent_starts(bus: Bus, ttl: float, queue_timeout: float) -> IdempotentStarts:
    # a pending claim outlives the longest admission (the queue's wait, the record's write),
    # so only a worker that died while admitting leaves one to expire
    return IdempotentStarts(
        bus.values,
        ttl=ttl,
        pending_ttl=queue_timeout + 30.0,
        in_flight_wait=min(queue_timeout, 5.0) + 1.0,
    )
