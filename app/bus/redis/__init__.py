"""The Redis bus: what the workers of any number of hosts share (``AGENT_REDIS_URL``).

One Redis primary (standalone, or managed/Sentinel failover; not Redis Cluster: scripts touch
keys of different slots), on redis-py's asyncio client. Every key is under one prefix
(``AGENT_REDIS_PREFIX``, default ``agent:``), so services and test runs can share a server::

    fence                 INCR counter: every lease's fencing token (grows, all sessions)
    lock:<session>        "<token> <holder>", SET NX PX: the session's lease
    route:<run>           worker id, PX: which worker holds the run (renewed with the lease)
    meta:<run>            hash session/fence/last/sealed: the run's log state
    log:<run>             stream, ids <seq>-0, fields t (type) and f (frame): the run's events
    live                  sorted set of unsealed logs (for the lost-run sweep)
    cmd:<worker>          pub/sub channel: commands for one worker
    reply:<request>       list: one command's answer (BLPOP), expires on its own
    bell:<worker>         stream: wakes a worker's follower (see ``follower``)
    val:<name>            string, PX: a shared value (idempotency keys, re-attach counts...)
    budget:<day>:<name>   INCRBY counter: a token budget's used and reserved tokens that day

Leases and fencing (``locks``): a session lock is ``SET NX PX`` with a token from ``INCR``;
renew and release are scripts that compare the whole value. Renewing also extends the run's
route and its unsealed log, so all three lapse together when a worker dies. Every append
carries the writer's token; the append script refuses a token lower than the highest the
log has seen (``LeaseLost``). The sweep that declares a run lost takes the session's lock
(a higher token) and writes ``run.failed`` (``worker_lost``) with it: the lost worker can no
longer write, even if it comes back.

Sealing (``log``): the terminal event seals the log, sets its TTL (``AGENT_EVENT_LOG_TTL``),
and in the same script releases the session lock held with the same token and drops the
route. So a reader never sees a run's end while its session still looks busy, and a worker
that dies after its run's end leaves nothing behind; and a worker that dies before it leaves
an unsealed log in ``live``, which the sweep finds (``RedisEventLog.orphans``).

Routing (``router``): ``PUBLISH`` on the holder's channel, answer on a reply list
(``BLPOP`` with a timeout).

Failure: every call is bounded (``connection``); Redis's errors become ``BusUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from redis.asyncio import Redis

from app.bus.base import BusUnavailable, Lease
from app.bus.redis import connection
from app.bus.redis.budgets import RedisBudgetCounters
from app.bus.redis.connection import (
    BLOCK_MS,
    SOCKET_TIMEOUT,
    Keys,
    make_client,
    redact_redis_url,
    unavailable,
    worker_id,
)
from app.bus.redis.locks import RedisSessionLocks, milliseconds
from app.bus.redis.log import RedisEventLog, RedisSubscription
from app.bus.redis.queue import RedisSessionQueue
from app.bus.redis.router import RedisRouter
from app.bus.redis.values import RedisValues

if TYPE_CHECKING:
    from app.settings import Settings

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PREFIX",
    "RedisBus",
    "RedisEventLog",
    "RedisRouter",
    "RedisSessionLocks",
    "RedisSubscription",
    "check_redis",
    "open_redis_bus",
    "redact_redis_url",
]

logger = logging.getLogger("app.bus.redis")

DEFAULT_PREFIX: Final = "agent:"
DEFAULT_MAX_CONNECTIONS: Final = 128
"""Connections one worker keeps to Redis at most (``AGENT_REDIS_MAX_CONNECTIONS``)."""
_START_TIMEOUT: Final = 10.0
_REPLY_TIMEOUT: Final = 2.0


async def check_redis(url: str, *, timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Raise ``BusUnavailable`` (one line, no password) unless Redis at ``url`` answers."""
    where = redact_redis_url(url)
    try:
        client = make_client(url, retries=0, socket_timeout=timeout)
    except ValueError as exc:
        raise BusUnavailable(f"AGENT_REDIS_URL {where!r} is not a Redis URL: {exc}") from exc
    try:
        async with unavailable(where, "answering PING"):
            async with asyncio.timeout(timeout):
                await client.ping()
    finally:
        await client.aclose()


class RedisBus:
    """The bus of one worker, on a shared Redis. Build it with ``open``."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        lease_seconds: float = 15.0,
        event_log_ttl: float = 600.0,
        max_events: int = 100_000,
        outage_grace: float | None = None,
        reply_timeout: float = _REPLY_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        call_timeout: float = 5.0,
    ) -> None:
        self.where = redact_redis_url(url)
        self.worker = worker_id()
        self.keys = Keys(prefix)
        # every call but the follower's blocking read and the appends shares this pool; those
        # two have a connection each of their own, outside the cap
        # every call, its attempts (the first and its retries) included, within call_timeout
        connection.CALL_TIMEOUT = call_timeout
        self._client: Redis = make_client(
            url, name=f"agent:{self.worker}", max_connections=max_connections
        )
        self._follower_client: Redis = make_client(
            url,
            socket_timeout=BLOCK_MS / 1000 + SOCKET_TIMEOUT,
            retries=0,
            single_connection=True,
            name=f"agent-follower:{self.worker}",
        )
        # an unsealed log outlives its writer's last renewal by this much: far longer than
        # the sweep needs to seal it, short enough that a whole fleet's crash leaves no litter
        live_ttl = max(event_log_ttl, 10 * lease_seconds)
        self._events = RedisEventLog(
            self._client,
            self._follower_client,
            self.keys,
            self.where,
            self.worker,
            ttl=event_log_ttl,
            max_events=max_events,
            live_ttl=live_ttl,
            outage_grace=outage_grace if outage_grace is not None else 2 * lease_seconds,
        )
        self._locks = RedisSessionLocks(self._client, self.keys, self.where, live_log_ttl=live_ttl)
        self._router = RedisRouter(
            self._client,
            self.keys,
            self.where,
            self.worker,
            route_ttl=lease_seconds,
            reply_timeout=reply_timeout,
        )
        self._values = RedisValues(self._client, self.keys, self.where)
        # a run ends by releasing its lock, then its route: if Redis fails the first, the
        # route's local entry must not outlive the run
        self._locks.on_release = self._released
        # runs waiting for a session's lock (``multitask_strategy: enqueue``), beside the locks
        self.queues = RedisSessionQueue(self._client, self.keys, self.where)
        self._closed = False

    def _released(self, run_id: str) -> None:
        """A lease of this worker's was given back: its run is no longer routed here, nor
        its log written here (its readers here follow it through Redis from now on)."""
        self._router.forget(run_id)
        self._events.released(run_id)

    async def start(self) -> None:
        """Check that Redis answers, start listening; raises ``BusUnavailable`` (and closes)."""
        try:
            async with unavailable(self.where, "answering PING"):
                async with asyncio.timeout(_START_TIMEOUT):
                    await self._client.ping()
            await self._router.start(_START_TIMEOUT)
            self._events.start()
        except BaseException:
            await self.aclose()
            raise
        logger.info("Redis bus ready", extra={"redis": self.where, "worker": self.worker})

    @property
    def events(self) -> RedisEventLog:
        return self._events

    def budget_counters(self) -> RedisBudgetCounters:
        """The token budget counters on this Redis, shared by every worker."""
        return RedisBudgetCounters(self._client, self.keys, self.where)

    @property
    def locks(self) -> RedisSessionLocks:
        return self._locks

    @property
    def router(self) -> RedisRouter:
        return self._router

    @property
    def values(self) -> RedisValues:
        return self._values

    async def open_run(self, run_id: str, *, session_id: str, fence: int) -> None:
        """The run's log and its route in one script call (``app.bus.base.Bus.open_run``)."""
        router = self._router
        await self._events.create(run_id, session_id=session_id, fence=fence, route=router.route)
        router.routed_here(run_id, session_id)

    async def claim_run(self, run_id: str, *, session_id: str, ttl: float) -> Lease | None:
        """The session's lease, the run's log and its route in one script call
        (``app.bus.base.Bus.claim_run``)."""
        router = self._router
        token = await self._events.claim(
            run_id, session_id=session_id, lease_ttl_ms=milliseconds(ttl), route=router.route
        )
        if token is None:
            return None
        router.routed_here(run_id, session_id)
        return self._locks.adopt(session_id, run_id, token)

    def stats(self) -> dict[str, int]:
        live = self._events.live_logs
        return {
            "event_logs": live,
            "live_event_logs": live,
            "subscribers": self._events.subscribers,
            "locks": self._locks.held,
            "routed_runs": self._router.registered,
        }

    async def ping(self) -> None:
        """``PING`` on the shared pool; raises ``BusUnavailable``."""
        async with unavailable(self.where, "answering PING"):
            await self._client.ping()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._router.aclose()
            await self._events.aclose()
        finally:
            await self._client.aclose()


async def open_redis_bus(settings: Settings) -> RedisBus:
    """The Redis bus for these settings (``AGENT_REDIS_URL``, ``AGENT_REDIS_PREFIX``)."""
    if settings.redis_url is None:
        raise ValueError("AGENT_REDIS_URL is not set")
    bus = RedisBus(
        settings.redis_url,
        prefix=settings.redis_prefix,
        lease_seconds=settings.lease_seconds,
        event_log_ttl=settings.event_log_ttl,
        max_events=settings.event_log_max_events,
        max_connections=settings.redis_max_connections,
        call_timeout=settings.backend_timeout,
    )
    await bus.start()
    return bus
