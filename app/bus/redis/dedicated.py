"""A script called on a connection of its own: the appends' call, on every event's path.

A call through the client's pool pays for the pool (a lock to take a connection and another
to give it back), the retry wrapper, a timeout per socket operation (on Python 3.11 a task
per write, through ``asyncio.wait_for``), the script's own ``EVALSHA``-then-``EVAL`` wrapper
and the command's encoding, argument by argument: about 115 µs of the worker's CPU a call on
the benchmark machine, against 40 µs for the same command written and read on a connection
of its own. ``DedicatedScript`` keeps such a connection (outside the pool's cap, as the
follower's) for one script: its command's head (``EVALSHA``, the sha, no keys, the arguments
that never change) is encoded once, each call adds its own arguments and goes out in one
write, and the whole call is bounded by its caller (``unavailable``), not per operation.

A call that fails on the connection (reset, closed) is made again on a new one, ``retries``
times: the append script is idempotent (a batch Redis already holds answers "duplicate"), so a
call that may have run can run again. A call cut short (cancelled, timed out) drops the
connection, whose reply may still be on its way. ``NOSCRIPT`` (Redis restarted, or its scripts
flushed) loads the script and calls again: that answer means it did not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, NoScriptError, TimeoutError

__all__ = ["DedicatedScript"]

_RETRY_PAUSE: Final = 0.05
"""Seconds before a call is made again on a new connection (times the attempt)."""

Argument = str | bytes | int


def _bulk(value: Argument) -> bytes:
    """One argument as a RESP bulk string."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


class DedicatedScript:
    """``script`` called with ``fixed`` and then each call's arguments, one call at a time,
    on a connection of its own made like ``client``'s (see the module docstring)."""

    def __init__(
        self,
        client: Redis,
        script: str,
        *,
        fixed: Sequence[Argument] = (),
        per_call: int,
        name: str | None = None,
        retries: int = 2,
    ) -> None:
        self._script = script
        self._sha: str = client.register_script(script).sha
        self._retries = retries
        count = 3 + len(fixed) + per_call  # EVALSHA, the sha, no keys, the arguments
        self._head = b"*%d\r\n" % count + b"".join(
            _bulk(part) for part in ("EVALSHA", self._sha, 0, *fixed)
        )
        self._per_call = per_call
        pool = client.connection_pool
        options: dict[str, Any] = dict(pool.connection_kwargs)
        # bounded per call by the caller, not per socket operation; never retried inside
        options.update(socket_timeout=None, health_check_interval=0, retry=Retry(NoBackoff(), 0))
        if name is not None:
            options["client_name"] = name
        self._connection: AbstractConnection = pool.connection_class(**options)
        self._lock = asyncio.Lock()

    async def __call__(self, *arguments: Argument) -> Any:
        """The script's reply; raises redis-py's errors (the caller maps them)."""
        if len(arguments) != self._per_call:
            raise TypeError(f"the script takes {self._per_call} arguments a call")
        parts = [self._head]
        for argument in arguments:  # each copied once, into the one write
            data = argument if isinstance(argument, bytes) else str(argument).encode()
            parts += (b"$%d\r\n" % len(data), data, b"\r\n")
        packed = b"".join(parts)
        async with self._lock:
            attempt = 0
            loaded = False
            while True:
                try:
                    return await self._call(packed)
                except NoScriptError:
                    if loaded:
                        raise
                    loaded = True
                    await self._load()
                except (ConnectionError, TimeoutError, OSError):
                    await self._drop()
                    if attempt >= self._retries:
                        raise
                    attempt += 1
                    await asyncio.sleep(_RETRY_PAUSE * attempt)

    async def _call(self, packed: bytes) -> Any:
        connection = self._connection
        try:
            if not connection.is_connected:
                await connection.connect()  # type: ignore[no-untyped-call]
            await connection.send_packed_command(packed, check_health=False)
            return await connection.read_response()
        except (NoScriptError, ConnectionError, TimeoutError, OSError):
            raise
        except BaseException:
            # cut short, or a reply this call cannot read: the connection's next bytes may be
            # this call's late reply, so it is not used again
            await self._drop()
            raise

    async def _load(self) -> None:
        connection = self._connection
        await connection.send_command("SCRIPT", "LOAD", self._script, check_health=False)
        await connection.read_response()

    async def _drop(self) -> None:
        await self._connection.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Close the connection (a call in flight fails)."""
        await self._drop()
