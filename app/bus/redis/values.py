"""``SharedValues`` in Redis: strings under ``val:<key>`` with a TTL, changed by scripts that
compare the whole value (so a writer never overwrites what another put there meanwhile)."""

from __future__ import annotations

from typing import Any, Final

from redis.asyncio import Redis

from app.bus.redis.connection import Keys, text, unavailable
from app.bus.redis.locks import milliseconds

__all__ = ["RedisValues"]

# KEYS: key. ARGV: value, ttl (ms). nil if stored, else the value already there.
_PUT_NEW: Final = """
local current = redis.call('GET', KEYS[1])
if current then
  return current
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

# KEYS: key. ARGV: old, new, ttl (ms). 1 if replaced, else 0.
_REPLACE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: key. ARGV: value. 1 if deleted, else 0.
_DELETE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisValues:
    """See the module docstring."""

    def __init__(self, client: Redis, keys: Keys, where: str) -> None:
        self._client = client
        self._prefix = f"{keys.prefix}val:"
        self._where = where
        self._put_new: Any = client.register_script(_PUT_NEW)
        self._replace: Any = client.register_script(_REPLACE)
        self._delete: Any = client.register_script(_DELETE)

    async def put_new(self, key: str, value: str, ttl: float) -> str | None:
        async with unavailable(self._where, "storing a shared value"):
            there = await self._put_new(keys=[self._prefix + key], args=[value, milliseconds(ttl)])
        return None if there is None else text(there)

    async def get(self, key: str) -> str | None:
        async with unavailable(self._where, "reading a shared value"):
            value = await self._client.get(self._prefix + key)
        return None if value is None else text(value)

    async def replace(self, key: str, old: str, new: str, ttl: float) -> bool:
        async with unavailable(self._where, "replacing a shared value"):
            done = await self._replace(
                keys=[self._prefix + key], args=[old, new, milliseconds(ttl)]
            )
        return bool(done)

    async def delete(self, key: str, value: str) -> bool:
        async with unavailable(self._where, "deleting a shared value"):
            done = await self._delete(keys=[self._prefix + key], args=[value])
        return bool(done)

    async def set(self, key: str, value: str, ttl: float) -> None:
        async with unavailable(self._where, "storing a shared value"):
            await self._client.set(self._prefix + key, value, px=milliseconds(ttl))
