"""The Redis side of the bus: key names, clients with bounded calls, and error mapping.

Every call is bounded: a connect and a socket read each time out (``SOCKET_TIMEOUT``), and a
failed call is retried at most ``RETRIES`` times with a short backoff, so a Redis that is
down or unreachable costs a caller a few seconds at most, never a wedge. redis-py's
``ConnectionError``/``TimeoutError`` (and the socket's ``OSError``) become the bus's
``BusUnavailable`` in one place, ``unavailable()``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import RedisError

from app.bus.base import BusUnavailable

__all__ = [
    "BLOCK_MS",
    "RETRIES",
    "SOCKET_TIMEOUT",
    "Keys",
    "make_client",
    "redact_redis_url",
    "text",
    "unavailable",
    "worker_id",
]

SOCKET_TIMEOUT: Final = 3.0
"""Seconds a connect or a read may take (per attempt)."""
RETRIES: Final = 2
"""Retries of a call that failed on a broken or timed-out connection."""
BLOCK_MS: Final = 5_000
"""How long the follower's ``XREAD BLOCK`` waits (its socket timeout is longer)."""


def redact_redis_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "redis://***"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def text(value: object) -> str:
    """A reply's bytes (or str) as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode()
    return str(value)


def worker_id() -> str:
    """A name for this worker, unique across hosts and restarts: host, pid, random."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def make_client(
    url: str,
    *,
    socket_timeout: float = SOCKET_TIMEOUT,
    retries: int = RETRIES,
    single_connection: bool = False,
    name: str | None = None,
    max_connections: int | None = None,
) -> Redis:
    """A client for ``url`` whose every call is bounded (see the module's docstring).

    ``max_connections`` caps its pool: a call finding every connection busy waits for one (up
    to ``socket_timeout``, then the call fails as unreachable) instead of opening another, so
    a burst of runs cannot open a connection each on every worker of a fleet.
    """
    retry = (
        Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries)
        if retries
        else Retry(NoBackoff(), 0)
    )
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": min(socket_timeout, SOCKET_TIMEOUT),
        "socket_keepalive": True,
        "health_check_interval": 10,
        "retry": retry,
        "decode_responses": False,
        "single_connection_client": single_connection,
        # RESP2: the reply shapes this package parses (XREAD's list of [stream, entries])
        "protocol": 2,
    }
    if name is not None:
        options["client_name"] = name
    if urlsplit(url).scheme == "unix":
        del options["socket_keepalive"]  # a TCP option: a Unix socket's connection refuses it
    if max_connections is None:
        client: Redis = Redis.from_url(url, **options)
        return client
    del options["single_connection_client"]
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=socket_timeout, **options
    )
    client = Redis(connection_pool=pool, single_connection_client=single_connection)
    client.auto_close_connection_pool = True  # closed with the client, as from_url's is
    return client


CALL_TIMEOUT: float | None = None
"""Seconds one bus call may take, its attempts included (``AGENT_BACKEND_TIMEOUT``): set by the
worker's ``RedisBus``; None leaves the calls bounded by their sockets' timeouts alone."""


class unavailable:
    """``async with unavailable(where, doing):`` bounds one call by ``CALL_TIMEOUT`` (plus
    ``extra``, for a blocking command's own wait) and maps Redis's and the socket's errors,
    and running out of time, to ``BusUnavailable`` naming the server.

    A class, not a generator-based manager: it is on the path of every event appended.
    """

    __slots__ = ("_doing", "_timeout", "_timer", "_where")

    def __init__(self, where: str, doing: str, *, extra: float = 0.0) -> None:
        self._where = where
        self._doing = doing
        self._timeout = None if CALL_TIMEOUT is None else CALL_TIMEOUT + extra
        self._timer: asyncio.Timeout | None = None

    async def __aenter__(self) -> None:
        if self._timeout is not None:
            self._timer = asyncio.timeout(self._timeout)
            await self._timer.__aenter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._timer is not None:
            try:
                await self._timer.__aexit__(kind, exc, tb)
            except TimeoutError as expired:
                raise BusUnavailable(
                    f"Redis at {self._where} did not answer within {self._timeout:g} s "
                    f"while {self._doing}"
                ) from expired
        if isinstance(exc, RedisError | OSError) or _closed_transport(exc):
            detail = str(exc) or type(exc).__name__
            raise BusUnavailable(
                f"Redis at {self._where} failed while {self._doing}: {detail}"
            ) from exc
        return False


def _closed_transport(exc: BaseException | None) -> bool:
    """uvloop's answer to a write on a connection the server just closed: a RuntimeError
    ("unable to perform operation on <TCPTransport closed=True ...>"), which redis-py lets
    through; it is the socket failing, like an OSError."""
    return isinstance(exc, RuntimeError) and "Transport closed=True" in str(exc)


class Keys:
    """Every key and channel the bus uses, under one prefix (``AGENT_REDIS_PREFIX``)."""

    __slots__ = ("fence", "live", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.fence = f"{prefix}fence"
        self.live = f"{prefix}live"

    def lock(self, session_id: str) -> str:
        return f"{self.prefix}lock:{session_id}"

    def route(self, run_id: str) -> str:
        return f"{self.prefix}route:{run_id}"

    def meta(self, run_id: str) -> str:
        return f"{self.prefix}meta:{run_id}"

    def log(self, run_id: str) -> str:
        return f"{self.prefix}log:{run_id}"

    def run_of_log(self, key: str) -> str:
        return key[len(self.prefix) + 4 :]

    def commands(self, worker: str) -> str:
        return f"{self.prefix}cmd:{worker}"

    def reply(self, request: str) -> str:
        return f"{self.prefix}reply:{request}"

    def bell(self, worker: str) -> str:
        return f"{self.prefix}bell:{worker}"
