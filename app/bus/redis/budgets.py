"""Token budget counters shared by every worker, in Redis (see ``app.admission.budgets``).

``budget:<day>:<name>`` holds the day's used plus reserved tokens of one budget
(``principal:alice``, ``agent:research``), expiring a day after the day ended. A reservation
checks and adds on every counter of the run in one script, so two workers racing for the last
tokens of a budget can never both get them. A run past its reservation is charged in one
script too, which says whether a budget is now used up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from redis.asyncio import Redis

from app.bus.redis.connection import Keys, text, unavailable
from app.bus.redis.locks import milliseconds

__all__ = ["RedisBudgetCounters"]

# KEYS: the counters. ARGV: amount, ttl (ms), then each counter's budget.
# 0 when the amount was added to every counter; else the index (from 1) of one that would
# pass its budget (nothing added).
_RESERVE: Final = """
local amount = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local used = tonumber(redis.call('GET', key) or '0')
  if used + amount > tonumber(ARGV[i + 2]) then
    return i
  end
end
for _, key in ipairs(KEYS) do
  redis.call('INCRBY', key, amount)
  redis.call('PEXPIRE', key, ARGV[2])
end
return 0
"""

# KEYS: the counters. ARGV: amount, ttl (ms), then each counter's budget. Adds to every counter
# (tokens already spent); the index (from 1) of one now at or past its budget, else 0.
_CHARGE: Final = """
local amount = tonumber(ARGV[1])
local full = 0
for i, key in ipairs(KEYS) do
  local used = redis.call('INCRBY', key, amount)
  redis.call('PEXPIRE', key, ARGV[2])
  if full == 0 and used >= tonumber(ARGV[i + 2]) then
    full = i
  end
end
return full
"""

# KEYS: the counters. ARGV: delta, ttl (ms). Only counters that still exist are corrected.
_ADJUST: Final = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('INCRBY', key, ARGV[1])
    redis.call('PEXPIRE', key, ARGV[2])
  end
end
return 0
"""


class RedisBudgetCounters:
    """``BudgetCounters`` on the shared Redis."""

    def __init__(self, client: Redis, keys: Keys, where: str) -> None:
        self._client = client
        self._prefix = keys.prefix
        self._where = where
        self._reserve: Any = client.register_script(_RESERVE)
        self._adjust: Any = client.register_script(_ADJUST)
        self._charge: Any = client.register_script(_CHARGE)

    def _key(self, day: str, name: str) -> str:
        return f"{self._prefix}budget:{day}:{name}"

    async def reserve(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        async with unavailable(self._where, "reserving a token budget"):
            full = await self._reserve(
                keys=[self._key(day, name) for name, _ in charges],
                args=[amount, milliseconds(ttl), *(limit for _, limit in charges)],
            )
        index = int(full)
        return None if index == 0 else charges[index - 1][0]

    async def charge(
        self, day: str, charges: Sequence[tuple[str, int]], amount: int, ttl: float
    ) -> str | None:
        async with unavailable(self._where, "charging a token budget"):
            full = await self._charge(
                keys=[self._key(day, name) for name, _ in charges],
                args=[amount, milliseconds(ttl), *(limit for _, limit in charges)],
            )
        index = int(full)
        return None if index == 0 else charges[index - 1][0]

    async def adjust(self, day: str, names: Sequence[str], delta: int, ttl: float) -> None:
        async with unavailable(self._where, "settling a token budget"):
            await self._adjust(
                keys=[self._key(day, name) for name in names], args=[delta, milliseconds(ttl)]
            )

    async def seed(self, day: str, used: Mapping[str, int], ttl: float) -> None:
        async with (
            unavailable(self._where, "seeding the token budgets"),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for name, tokens in used.items():
                pipe.set(self._key(day, name), tokens, nx=True, px=milliseconds(ttl))
            await pipe.execute()

    async def value(self, day: str, name: str) -> int:
        """A counter's value (0 if absent): for tests and inspection."""
        async with unavailable(self._where, "reading a token budget"):
            raw = await self._client.get(self._key(day, name))
        return 0 if raw is None else int(text(raw))
