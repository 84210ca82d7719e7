"""A worker's lifetime: build everything on its own loop, warm up, drain, close.

Startup (in order): the store, the bus, the agents (one ``AgentCore`` per configured agent,
built on the worker's loop, see ``app.agents.build``), the run manager; then the bindings'
preflight, which refuses to start on a bad model configuration. The warm-up follows in the
background: MCP tool discovery, then one short run per agent (none with ``AGENT_WARMUP=0``: an
agent is then ``configured`` rather than ``ready``); ``/readyz`` turns 200 once every required
agent warmed up (``app.agents.health``; each failed agent is retried until it succeeds).

Shutdown on SIGTERM or SIGINT: the first signal starts the drain at once, while the server
still accepts connections (``/readyz`` 503, new runs 503 ``draining``); runs get
``AGENT_DRAIN_TIMEOUT`` to finish, the rest are cancelled (``reason: shutdown``). Only then is
the signal passed on to uvicorn, which stops listening and waits for the open streams to send
their terminal events; the lifespan's end closes the agents, then their MCP clients, the bus
and the store. A second signal goes to uvicorn at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from fastapi import FastAPI

from agent_runtime.agent import AgentCore
from app.admission.budgets import BudgetRules, Budgets, LocalBudgetCounters, parse_budgets
from app.admission.slots import Admission
from app.agents.build import DEFAULT_AGENT, ServiceConfig, build_agents, build_core, load_config
from app.agents.config import ConfigError
from app.auth.stream_tokens import open_stream_tokens
from app.bus import open_bus
from app.bus.base import Bus
from app.capabilities.jobs import MediaJobs
from app.files import FileRetention, FileService
from app.runs import RunManager
from app.runs.handle import RunRequestOptions
from app.runs.stateless import StatelessReaper
from app.schedules import Scheduler, Schedules
from app.server.readiness import DependencyWatch
from app.server.services import Services
from app.settings import Settings
from app.storage import Store, open_store
from app.telemetry.metrics import Metrics
from app.telemetry.tracing import Tracing, check_tracing_environment
from app.webhooks.delivery import WebhookSecrets, WebhookSender
from app.webhooks.hooks import RunWebhooks
from app.webhooks.signing import parse_endpoint_secrets, parse_secret
from app.webhooks.targets import WebhookTargets

__all__ = [
    "DrainOnSignal",
    "build_agent",
    "check_configuration",
    "make_lifespan",
    "start_services",
    "stop_services",
]

logger = logging.getLogger("app.server.lifespan")

_WARMUP_PROMPT = "Reply with OK."
_WARMUP_RETRY_MAX = 30.0


async def build_agent(settings: Settings, config: ServiceConfig) -> AgentCore:
    """The ``default`` agent of ``config`` alone, without its MCP tools (for tests); the
    service builds every agent with ``app.agents.build.build_agents``."""
    return await build_core(settings, config.agents[DEFAULT_AGENT])


async def check_configuration(settings: Settings) -> None:
    """Fail early, with one clear message, on settings that cannot work.

    Reads and validates ``AGENT_CONFIG``, parses ``AGENT_API_KEYS`` and builds every agent's
    model bindings and their preflight on a throw-away loop (no network call, no MCP server
    started). Raises ValueError (a ConfigurationError is one) or RuntimeError.
    ``agent-server`` runs it before starting any worker.
    """
    config = load_config(settings.config)
    settings.api_key_map  # noqa: B018 - parsing is the check
    check_tracing_environment()
    agents = await build_agents(settings, config)
    try:
        await agents.preflight()
    finally:
        await agents.aclose()


async def start_services(settings: Settings, metrics: Metrics | None = None) -> Services:
    """Open the store and bus, build the agent and run manager, preflight."""
    config = load_config(settings.config)
    metrics = metrics or Metrics()
    async with contextlib.AsyncExitStack() as stack:
        store = await open_store(settings.database_url, timeout=settings.backend_timeout)
        stack.push_async_callback(store.close)
        bus = await open_bus(settings)
        stack.push_async_callback(bus.aclose)
        tracing = Tracing.from_environment(capture_content=settings.trace_content)
        if tracing is not None:
            stack.push_async_callback(tracing.aclose)
        files = FileService(store, max_bytes=settings.max_file_bytes)
        agents = await build_agents(
            settings, config, tracing.tracer if tracing else None, files.content_store()
        )
        # LIFO: the MCP clients close after the agents that use them
        stack.push_async_callback(agents.close_mcp)
        stack.push_async_callback(agents.aclose)
        await agents.preflight()
        agent = agents.default
        budgets = await open_budgets(settings, config, store, bus)
        webhooks = open_webhooks(settings, config, store, metrics)
        if webhooks is not None and webhooks.sender is not None:
            stack.push_async_callback(webhooks.sender.aclose)
        admission = _admission(settings, metrics)
        manager = RunManager(
            agent=agent,
            store=store,
            bus=bus,
            admission=admission,
            metrics=metrics,
            profiles=config.agents,
            agents=agents.cores,
            queue_timeout=settings.queue_timeout,
            lease_seconds=settings.lease_seconds,
            resume_runs=settings.resume_runs,
            # parked runs are resumed by another worker's sweep, or by the restart of the
            # only worker (its recovery at start); several unshared workers have neither
            hand_over=settings.resume_runs and (bus.shared or settings.workers == 1),
            max_resumes=settings.max_resumes,
            max_session_queue=settings.max_session_queue,
            debug=settings.debug,
            unavailable=agents.states.unavailable,
            budgets=budgets,
            disconnect_grace=settings.disconnect_grace,
            reader_refresh=settings.sse_ping,
            idempotency_ttl=settings.idempotency_ttl,
            tracing=tracing,
            webhooks=webhooks,
        )
        stack.push_async_callback(manager.aclose)
        if not bus.shared and settings.workers == 1:
            await manager.recover()
        services = Services(
            settings=settings,
            metrics=metrics,
            store=store,
            bus=bus,
            agent=agent,
            agents=agents,
            admission=admission,
            manager=manager,
            media=MediaJobs(agents, admission, queue_timeout=settings.queue_timeout),
            tracing=tracing,
            webhooks=webhooks,
            files=files,
            file_retention=FileRetention(store, retention=settings.file_retention),
        )
        await _add_background_services(services, config)
        if webhooks is not None and webhooks.sender is not None:
            webhooks.sender.start()  # after recovery: the outbox's messages of before go out
        stack.pop_all()
    return services


def _admission(settings: Settings, metrics: Metrics) -> Admission:
    """The worker's run slots and queue, reported to the metrics as they change."""

    def on_admission_change(running: int, queued: int) -> None:
        metrics.runs_in_flight.set(running)
        metrics.runs_queued.set(queued)

    return Admission(
        max_running=settings.max_concurrent_runs,
        max_queued=settings.max_queued_runs,
        per_principal=settings.per_principal_max_runs,
        on_change=on_admission_change,
    )


async def _add_background_services(services: Services, config: ServiceConfig) -> None:
    """The schedules (and their scheduler), the stateless sessions' reaper, stream tokens."""
    settings, store, bus = services.settings, services.store, services.bus
    services.schedules = Schedules(
        store,
        tuple(config.agents),
        max_per_principal=settings.scheduler_max_per_principal,
        min_interval=settings.scheduler_min_interval,
    )
    if settings.scheduler_enabled:
        services.scheduler = build_scheduler(settings, store, services.manager)
    services.stateless = StatelessReaper(
        store,
        bus.locks,
        retention=settings.stateless_retention,
        lock_seconds=settings.lease_seconds,
    )
    api_keys = settings.api_keys
    if api_keys is not None:
        secret = settings.stream_token_secret
        services.stream_tokens = await open_stream_tokens(
            bus,
            secret=None if secret is None else secret.get_secret_value(),
            api_keys=api_keys.get_secret_value(),
            ttl=settings.stream_token_ttl,
        )


def open_webhooks(
    settings: Settings, config: ServiceConfig, store: Store, metrics: Metrics | None = None
) -> RunWebhooks | None:
    """The runs' webhooks and this worker's sender; None when no signing secret is set.

    Raises ``ConfigError`` for an agent whose ``webhook_url`` no secret signs."""
    secret = settings.webhook_secret
    by_origin = settings.webhook_secrets
    keys = WebhookSecrets(
        default=None if secret is None else parse_secret(secret.get_secret_value()),
        by_origin=None
        if by_origin is None
        else parse_endpoint_secrets(by_origin.get_secret_value()),
    )
    for profile in config.agents.values():
        if profile.webhook_url is not None and keys.key_for(profile.webhook_url) is None:
            raise ConfigError(
                config.path or "AGENT_CONFIG",
                f"agents.{profile.name}.webhook_url",
                "no signing secret for this endpoint: set AGENT_WEBHOOK_SECRET (or its "
                "entry in AGENT_WEBHOOK_SECRETS)",
            )
    if not keys.any:
        return None
    targets = WebhookTargets(allow_private=settings.webhook_allow_private)
    sender = WebhookSender(
        store,
        targets,
        keys,
        max_attempts=settings.webhook_max_attempts,
        backoff=settings.webhook_backoff,
        backoff_max=settings.webhook_backoff_max,
        timeout=settings.webhook_timeout,
        poll_interval=settings.webhook_poll_interval,
        retention=settings.webhook_retention,
        metrics=metrics,
    )
    return RunWebhooks(targets, keys, sender)


def build_scheduler(settings: Settings, store: Store, manager: RunManager) -> Scheduler:
    """This worker's scheduler, firing through the run manager's admission."""

    async def start_run(principal: str, session_id: str, options: RunRequestOptions) -> str:
        return (await manager.submit(principal, session_id, options)).run_id

    return Scheduler(
        store,
        start_run,
        poll_interval=settings.scheduler_poll_interval,
        lease_seconds=settings.scheduler_lease_seconds,
        misfire_grace=settings.scheduler_misfire_grace,
        max_attempts=settings.scheduler_max_attempts,
    )


async def open_budgets(
    settings: Settings, config: ServiceConfig, store: Store, bus: Bus
) -> Budgets:
    """The token budgets (``AGENT_BUDGETS``, the agents' ``tokens_per_day``): counters in
    Redis with a shared bus, else in memory; seeded from the day's usage in the store."""
    principals, agent_budgets = parse_budgets(settings.budgets)
    from_file = {
        name: profile.tokens_per_day
        for name, profile in config.agents.items()
        if profile.tokens_per_day is not None
    }
    rules = BudgetRules(
        principals=principals,
        agents={**from_file, **agent_budgets},  # the environment's line wins
        reserve=settings.budget_reserve_tokens,
    )
    make_counters = getattr(bus, "budget_counters", None)
    counters = make_counters() if bus.shared and callable(make_counters) else None
    budgets = Budgets(rules, counters or LocalBudgetCounters())
    if rules.enabled:
        # once at start, never per run: the day's finished runs, by principal and by agent
        now = datetime.now(UTC)
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        used: dict[str, int] = {}
        for group in ("principal", "agent"):
            totals = await store.usage_totals(
                start=day, end=day + timedelta(days=1), group_by=group
            )
            for total in totals:
                used[f"{group}:{total.key}"] = total.input_tokens + total.output_tokens
        await budgets.seed(used)
    return budgets


async def warm_up(services: Services) -> None:
    """Warm every agent up (MCP tool discovery, one short run each), retrying the ones that
    failed with backoff until all succeeded. The worker turns ready as soon as its required
    agents are (``app.agents.health``); optional ones keep being retried meanwhile."""
    states = services.agents.states
    delay = 0.5
    while True:
        try:
            done = await services.agents.warm_up(
                _WARMUP_PROMPT, call_model=services.settings.warmup
            )
        except Exception as exc:  # not one agent's failure: the round itself failed
            logger.warning("warm-up failed; retrying", extra={"error": str(exc), "retry_in": delay})
            services.readiness_problem = f"the warm-up failed ({type(exc).__name__})"
            done = False
        else:
            services.readiness_problem = states.problem
        if states.ready and not services.ready:
            services.ready = True
            logger.info("ready", extra={"readiness": services.readiness})
        if done:
            return
        if services.ready:
            logger.warning(
                "an optional agent is unavailable; retrying",
                extra={"problem": "; ".join(f"{h.name}: {h.reason}" for h in states if h.reason)},
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, _WARMUP_RETRY_MAX)


async def stop_services(services: Services) -> None:
    """Stop the scheduler, drain (if not done yet), then close the agent, bus and store."""
    try:
        if services.scheduler is not None:
            await services.scheduler.aclose()
        if services.stateless is not None:
            await services.stateless.aclose()
        if services.file_retention is not None:
            await services.file_retention.aclose()
        await services.manager.drain(services.settings.drain_timeout)
    finally:
        await services.manager.aclose()
        try:
            try:
                if services.media is not None:  # their providers close with the agents
                    await services.media.aclose()
                await services.agents.aclose()
            finally:
                await services.agents.close_mcp()
        finally:
            try:
                if services.webhooks is not None and services.webhooks.sender is not None:
                    await services.webhooks.sender.aclose()  # its messages wait in the outbox
                await services.bus.aclose()
            finally:
                try:
                    await services.store.close()
                finally:
                    if services.tracing is not None:  # last: the spans of the drain go out
                        await services.tracing.aclose()


class DrainOnSignal:
    """Puts the drain before uvicorn's own reaction to SIGTERM/SIGINT.

    uvicorn installs its signal handlers before the lifespan starts; this wraps them. The
    first signal starts the drain on the loop and passes the signal on only when the drain is
    over; a second one is passed on at once. Nothing happens outside the main thread (where
    signals cannot be handled) or when no handler is installed.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, loop: asyncio.AbstractEventLoop, drain: Callable[[], Any]) -> None:
        self._loop = loop
        self._drain = drain
        self._previous: dict[int, Callable[[int, FrameType | None], Any]] = {}
        self._triggered = False
        self._task: asyncio.Task[None] | None = None

    def install(self) -> bool:
        """Wrap the current handlers; False if there is nothing to wrap."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if not callable(signal.getsignal(signal.SIGTERM)):
            return False  # nobody (no server) handles SIGTERM: not ours to take over
        for sig in self.SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        return bool(self._previous)

    def uninstall(self) -> None:
        """Put the wrapped handlers back (if ours are still installed)."""
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        if previous is None:  # pragma: no cover - only installed for wrapped signals
            return
        if self._triggered:
            previous(signum, frame)
            return
        self._triggered = True
        self._loop.call_soon_threadsafe(self._start, signum, previous)

    def _start(self, signum: int, previous: Callable[[int, FrameType | None], Any]) -> None:
        async def drain_then_forward() -> None:
            try:
                await self._drain()
            except Exception:
                logger.exception("drain failed")
            finally:
                previous(signum, None)

        logger.info("signal received: draining before shutdown", extra={"signal": signum})
        self._task = self._loop.create_task(drain_then_forward())


def make_lifespan(
    settings: Settings, metrics: Metrics
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan for these settings."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = await start_services(settings, metrics)
        app.state.services = services
        probes: dict[str, Callable[[], Awaitable[object]]] = {"the store": services.store.ping}
        if services.bus.shared:
            probes["Redis"] = services.bus.ping
        watch = DependencyWatch(probes, timeout=min(2.0, settings.backend_timeout))
        services.dependencies = watch
        watch.start()
        loop = asyncio.get_running_loop()
        warmup = loop.create_task(warm_up(services))

        async def drain() -> None:
            if services.scheduler is not None:  # a draining worker claims no more firings
                await services.scheduler.aclose()
            services.manager.begin_drain()
            await services.manager.drain(settings.drain_timeout)

        hook = DrainOnSignal(loop, drain)
        hook.install()
        try:
            if services.scheduler is not None:  # stopped by stop_services, on every path
                services.scheduler.start()
            if services.stateless is not None:  # stopped by stop_services too
                services.stateless.start()
            if services.file_retention is not None:  # stopped by stop_services too
                services.file_retention.start()
            yield
        finally:
            hook.uninstall()
            await watch.aclose()
            warmup.cancel()
            await asyncio.wait([warmup])
            await stop_services(services)
            app.state.services = None

    return lifespan
