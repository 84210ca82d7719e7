"""Session locks as fenced leases in Redis: ``SET NX PX`` under a token from ``INCR``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis

from app.bus.base import Lease, LeaseLost
from app.bus.redis import scripts
from app.bus.redis.connection import Keys, text, unavailable

__all__ = ["RedisSessionLocks", "lock_value", "milliseconds"]


_RENEW_CHUNK = 1_000
"""Leases renewed in one call at most (a worker with more makes several)."""


def milliseconds(seconds: float) -> int:
    """A TTL in whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))


def lock_value(lease: Lease) -> str:
    """What the lock key holds for this lease."""
    return f"{lease.token} {lease.holder}"


class RedisSessionLocks:
    """One lease per session, ``"<token> <holder>"`` with a TTL; checked and changed only by
    scripts that compare the whole value, so a lease never touches a successor's lock.

    Renewing a lease also extends the route (run → worker) and the unsealed log of the run
    that holds it: all three expire together when the worker stops renewing.
    """

    def __init__(self, client: Redis, keys: Keys, where: str, *, live_log_ttl: float) -> None:
        self._client = client
        self._keys = keys
        self._where = where
        self._live_log_ms = milliseconds(live_log_ttl)
        self._acquire: Any = client.register_script(scripts.ACQUIRE)
        self._renew: Any = client.register_script(scripts.RENEW)
        self._renew_many: Any = client.register_script(scripts.RENEW_MANY)
        # told the holder (the run) of every lease released, even when Redis is unreachable
        self.on_release: Callable[[str], None] | None = None
        self._release: Any = client.register_script(scripts.RELEASE)
        self._held: dict[tuple[str, int], Lease] = {}

    async def acquire(
        self, session_id: str, holder: str, ttl: float, *, exclusive: bool = False
    ) -> Lease | None:
        async with unavailable(self._where, "taking a session lock"):
            token = await self._acquire(
                keys=[self._keys.lock(session_id), self._keys.fence],
                args=[holder, milliseconds(ttl), 1 if exclusive else 0],
            )
        if token is None:
            return None
        lease = Lease(session_id, holder, int(token))
        self._held[(session_id, lease.token)] = lease
        return lease

    def adopt(self, session_id: str, holder: str, token: int) -> Lease:
        """The lease a script took with another write (``RedisBus.claim_run``), as held."""
        lease = Lease(session_id, holder, token)
        self._held[(session_id, token)] = lease
        return lease

    async def renew(self, lease: Lease, ttl: float) -> None:
        keys = self._keys
        async with unavailable(self._where, "renewing a session lock"):
            renewed = await self._renew(
                keys=[
                    keys.lock(lease.session_id),
                    keys.route(lease.holder),
                    keys.meta(lease.holder),
                    keys.log(lease.holder),
                ],
                args=[lock_value(lease), milliseconds(ttl), self._live_log_ms],
            )
        if not renewed:
            raise LeaseLost(
                f"the lock of session {lease.session_id!r} is no longer held by {lease.holder!r}"
            )

    async def renew_many(self, leases: Sequence[Lease], ttl: float) -> list[bool]:
        renewed: list[bool] = []
        for start in range(0, len(leases), _RENEW_CHUNK):
            args: list[str | int] = [self._keys.prefix, milliseconds(ttl), self._live_log_ms]
            for lease in leases[start : start + _RENEW_CHUNK]:
                args += (lease.session_id, lock_value(lease), lease.holder)
            async with unavailable(self._where, "renewing session locks"):
                answer = await self._renew_many(keys=(), args=args)
            renewed += [flag == ord("1") for flag in bytes(answer)]
        return renewed

    async def release(self, lease: Lease) -> None:
        self._held.pop((lease.session_id, lease.token), None)
        if self.on_release is not None:
            # before the call that may fail: what this worker holds for the run goes now
            self.on_release(lease.holder)
        async with unavailable(self._where, "releasing a session lock"):
            await self._release(keys=[self._keys.lock(lease.session_id)], args=[lock_value(lease)])

    async def holder(self, session_id: str) -> str | None:
        async with unavailable(self._where, "reading a session lock"):
            value = await self._client.get(self._keys.lock(session_id))
        if value is None:
            return None
        _, _, holder = text(value).partition(" ")
        return holder

    async def holders(self, session_ids: Sequence[str]) -> list[str | None]:
        if not session_ids:
            return []
        async with unavailable(self._where, "reading session locks"):
            values = await self._client.mget([self._keys.lock(s) for s in session_ids])
        return [None if value is None else text(value).partition(" ")[2] for value in values]

    @property
    def held(self) -> int:
        """Leases this worker acquired and has not released."""
        return len(self._held)
