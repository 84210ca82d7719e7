"""What every part of the run manager shares: the worker's dependencies and its held runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from agent_runtime.agent import AgentCore
from agent_runtime.events import AgentPhase
from agent_runtime.run_context import BARE_CONTEXT
from app.admission.budgets import Budgets
from app.admission.slots import Admission
from app.agents.build import AgentProfile
from app.bus.base import AppendNowait, Bus
from app.errors import Unavailable
from app.runs.cancel_marks import CancelMarks
from app.runs.handle import RunHandle
from app.storage import RunRecord, RunStatus, Store
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing

if TYPE_CHECKING:
    from app.webhooks.hooks import RunWebhooks

__all__ = ["RunContext", "lease_lapsed"]

_RETRY_AFTER_LAPSED = 2.0


def lease_lapsed(run_id: str) -> Unavailable:
    """The answer about a run this worker held past its lease deadline (503)."""
    return Unavailable(
        f"this server lost contact with the session lease of run {run_id!r}: it no longer "
        "acts for the run; ask again (another server may hold the run now)",
        retry_after=_RETRY_AFTER_LAPSED,
    )


class RunContext:
    """The worker's agents, store, bus, admission and metrics, and the table of the runs it
    holds (``runs``, with the tasks that drive them and an event set while there are none).

    A run is in ``runs`` from its admission until its terminal event was appended; every
    part of the run manager reads it from here, and only ``hold``/``forget`` change it.
    """

    def __init__(
        self,
        *,
        agent: AgentCore,
        agents: Mapping[str, AgentCore],
        store: Store,
        bus: Bus,
        admission: Admission,
        metrics: Metrics,
        profiles: Mapping[str, AgentProfile],
        queue_timeout: float,
        lease_seconds: float,
        debug: bool,
        unavailable: Callable[[str], str | None] | None = None,
        budgets: Budgets | None = None,
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | None = None,
        webhooks: RunWebhooks | None = None,
        resume_runs: bool = False,
        max_resumes: int = 3,
        hand_over: bool = False,
    ) -> None:
        self.agent = agent
        # resume runs of a dead, fenced-off or stopping worker from their checkpoints
        # (app.runs.resume); off: they end worker_lost, and no checkpoint is saved
        self.resume_runs = resume_runs
        self.max_resumes = max_resumes
        # park runs at shutdown for another worker (or the restart) to resume
        self.hand_over = hand_over and resume_runs
        # the worker's trace pipeline when OTEL_* asks for one (app.telemetry.tracing), else None
        self.tracing = tracing
        # the runs' webhooks (app.webhooks); None: a run start's webhook_url is refused
        self.webhooks = webhooks
        # the token budgets, when any is set (checked at admission, settled at a run's end)
        self.budgets = budgets if budgets is not None and budgets.enabled else None
        # why an agent cannot take runs now (its warm-up failed), or None
        self.unavailable: Callable[[str], str | None] = unavailable or _always_available
        # each configured agent's own core; a profile without one runs on ``agent``
        self.agents = dict(agents)
        self.store = store
        self.bus = bus
        self.events = bus.events
        # cancels asked while no worker held their run, for its next owner (app.runs.cancel_marks)
        self.cancel_marks = CancelMarks(bus.values, lease_seconds)
        # the in-process log appends without a coroutine; others are awaited
        self.append_nowait: AppendNowait | None = getattr(bus.events, "append_nowait", None)
        self.admission = admission
        self.metrics = metrics
        self.profiles = dict(profiles)
        self.queue_timeout = queue_timeout
        self.lease_seconds = lease_seconds
        # A dead worker's runs must end within lease_seconds of its death: the lease lapses
        # 2/3 of the way there at the latest, and the sweep, every 1/6, notices it by 5/6.
        self.lease_ttl = lease_seconds * 2 / 3
        self.debug = debug
        # the monotonic clock the runs' lease deadlines are on (app.runs.fencing)
        self.clock = clock
        self.draining = False
        # resolved once the drain is over: the event streams still open here end, so that
        # their clients resume on another worker (or on this one after its restart)
        self._drained: asyncio.Future[None] | None = None
        self.runs: dict[str, RunHandle] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        # one bound method for every task's done callback (runs may be many)
        self._discard_task = self.tasks.discard
        self.idle = asyncio.Event()
        self.idle.set()

    def drained(self) -> asyncio.Future[None]:
        """Resolved once this worker's drain is over."""
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        return self._drained

    def webhook_url(self, handle: RunHandle) -> str | None:
        """Where the run's notifications go: the request's URL, else its agent's, else
        None (and None while webhooks are off)."""
        if self.webhooks is None:
            return None
        return handle.options.webhook_url or handle.profile.webhook_url

    def agent_for(self, handle: RunHandle) -> AgentCore:
        """The core that runs the handle's agent."""
        return self.agents.get(handle.profile.name, self.agent)

    def all_agents(self) -> list[AgentCore]:
        """Every distinct core of this worker."""
        return list({id(a): a for a in (self.agent, *self.agents.values())}.values())

    def live_status(self, handle: RunHandle) -> RunStatus:
        """The handle's status, ``waiting`` while the runtime waits for an answer whose
        question any reader of the run's log can see."""
        status = handle.status
        if status == "running" and handle.in_runtime and not handle.appending:
            run = self.agent_for(handle).active_runs.get(handle.run_id)
            # waiting once its question is in the log: every event before the wait was taken
            # from the runtime, and none is on its way to the log (``RunDriver``)
            if run is not None and run.phase is AgentPhase.WAITING and not run.undelivered:
                return "waiting"
        return status

    def lapsed(self, handle: RunHandle) -> bool:
        """True once the run's lease may have lapsed: it was fenced off, or its deadline
        passed (the watchdog fences it off at its next turn). Such a run is no longer
        this worker's to speak for (``app.runs.fencing``)."""
        return handle.fenced or self.clock() >= handle.lease_deadline

    async def find(
        self, run_id: str, principal: str, session_id: str | None = None
    ) -> RunHandle | RunRecord | None:
        """The run (held here, else stored) if it exists, belongs to ``principal`` and, when
        ``session_id`` is given, to that session: the one place a run a request names is
        resolved together with its owner (every route, protocol and command goes through it).

        A run held here whose lease may have lapsed is answered from the store: this worker
        no longer knows whether it is live.
        """
        handle = self.runs.get(run_id)
        if (
            handle is not None
            and handle.principal == principal
            and session_id in (None, handle.session_id)
            and not self.lapsed(handle)
        ):
            return handle
        # another principal's live run costs the query an unknown id costs: the answer's timing
        # must not tell that such a run exists; a run held here past its lease is answered
        # from the store (below)
        record = await self.store.get_run(run_id)
        if record is None or record.principal != principal:
            return None
        if session_id is not None and record.session_id != session_id:
            return None  # the caller's run, named under another of its sessions
        if handle is not None and not record.is_finished:
            # stored as unfinished, held here past its lease: neither may be true any more
            raise lease_lapsed(run_id)
        return record

    def hold(self, handle: RunHandle) -> None:
        """The run is now this worker's."""
        self.runs[handle.run_id] = handle
        self.idle.clear()

    def forget(self, run_id: str) -> None:
        """The run is no longer this worker's (its end is written, or its start undone)."""
        self.runs.pop(run_id, None)
        if not self.runs:
            self.idle.set()

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of this worker's runs, kept until it ends."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._discard_task, context=BARE_CONTEXT)
        return task

    def reject(self, reason: str) -> None:
        """Count a refused run start."""
        self.metrics.runs_rejected.labels(reason).inc()


def _always_available(_agent: str) -> None:
    return None
