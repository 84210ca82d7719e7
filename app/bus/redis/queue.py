"""Session queues in Redis (see ``app.bus.queue``), beside the session locks.

::

    squeue:<session>      list of run ids: the session's line, front first
    squeued:<run>         the queued run's entry (JSON), PX: lapses unless its worker renews it
    sclaimed:<run>        the entry of a run claimed to start, PX 60 s: still visible to
                          ``GET /v1/runs/{id}`` until its record exists

Every check-and-write is one script; ids in the line whose entry lapsed are passed over (and
dropped) by the next push or turn, so a dead worker's queued runs block no one.
"""

from __future__ import annotations

from typing import Any, Final

from redis.asyncio import Redis

from app.bus.queue import QueueEntry, QueueState
from app.bus.redis.connection import Keys, text, unavailable
from app.bus.redis.locks import milliseconds

__all__ = ["RedisSessionQueue"]

_CLAIMED_MS: Final = 60_000

# KEYS: line, entry. ARGV: entry json, ttl ms, front (1/0), limit (-1: none), entry key
# prefix, run id, line ttl ms. The entry's position, or -1 when the line is full.
_PUSH: Final = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  if redis.call('EXISTS', ARGV[5] .. id) == 0 then redis.call('LREM', KEYS[1], 0, id) end
end
local limit = tonumber(ARGV[4])
if limit >= 0 and redis.call('LLEN', KEYS[1]) >= limit then return -1 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
if ARGV[3] == '1' then
  redis.call('LPUSH', KEYS[1], ARGV[6])
else
  redis.call('RPUSH', KEYS[1], ARGV[6])
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return redis.call('LPOS', KEYS[1], ARGV[6]) + 1
"""

# KEYS: line, entry. ARGV: run id, ttl ms, entry key prefix, line ttl ms.
# The entry's position after dropping lapsed entries ahead of it; 0 if it is not queued.
_TURN: Final = """
local pos = redis.call('LPOS', KEYS[1], ARGV[1])
if not pos then return 0 end
if redis.call('PEXPIRE', KEYS[2], ARGV[2]) == 0 then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  return 0
end
if pos > 0 then
  local ids = redis.call('LRANGE', KEYS[1], 0, pos - 1)
  for _, id in ipairs(ids) do
    if redis.call('EXISTS', ARGV[3] .. id) == 0 then redis.call('LREM', KEYS[1], 0, id) end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return redis.call('LPOS', KEYS[1], ARGV[1]) + 1
"""

# KEYS: line, entry, claimed. ARGV: run id, claimed ttl ms. 1 if claimed, 0 if not queued.
_CLAIM: Final = """
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then return 0 end
local entry = redis.call('GET', KEYS[2])
redis.call('DEL', KEYS[2])
if entry then redis.call('SET', KEYS[3], entry, 'PX', ARGV[2]) end
return 1
"""

# KEYS: line, entry. ARGV: run id. 1 if it was queued (and is no more), else 0.
_CANCEL: Final = """
local removed = redis.call('LREM', KEYS[1], 0, ARGV[1])
redis.call('DEL', KEYS[2])
return removed
"""


class RedisSessionQueue:
    """The session queues of every worker sharing one Redis."""

    def __init__(self, client: Redis, keys: Keys, where: str) -> None:
        self._client = client
        self._where = where
        self._prefix = keys.prefix
        self._push: Any = client.register_script(_PUSH)
        self._turn: Any = client.register_script(_TURN)
        self._claim: Any = client.register_script(_CLAIM)
        self._cancel: Any = client.register_script(_CANCEL)

    def _line(self, session_id: str) -> str:
        return f"{self._prefix}squeue:{session_id}"

    def _entry(self, run_id: str) -> str:
        return f"{self._prefix}squeued:{run_id}"

    def _claimed(self, run_id: str) -> str:
        return f"{self._prefix}sclaimed:{run_id}"

    async def push(
        self, entry: QueueEntry, *, front: bool, limit: int | None, ttl: float
    ) -> int | None:
        async with unavailable(self._where, "queueing a run"):
            position = await self._push(
                keys=[self._line(entry.session_id), self._entry(entry.run_id)],
                args=[
                    entry.to_json(),
                    milliseconds(ttl),
                    1 if front else 0,
                    -1 if limit is None else limit,
                    f"{self._prefix}squeued:",
                    entry.run_id,
                    milliseconds(ttl * 10),
                ],
            )
        return None if int(position) < 0 else int(position)

    async def turn(self, session_id: str, run_id: str, ttl: float) -> int | None:
        async with unavailable(self._where, "renewing a queued run"):
            position = await self._turn(
                keys=[self._line(session_id), self._entry(run_id)],
                args=[run_id, milliseconds(ttl), f"{self._prefix}squeued:", milliseconds(ttl * 10)],
            )
        return int(position) or None

    async def claim(self, session_id: str, run_id: str) -> bool:
        async with unavailable(self._where, "starting a queued run"):
            claimed = await self._claim(
                keys=[self._line(session_id), self._entry(run_id), self._claimed(run_id)],
                args=[run_id, _CLAIMED_MS],
            )
        return bool(claimed)

    async def cancel(self, session_id: str, run_id: str) -> bool:
        async with unavailable(self._where, "cancelling a queued run"):
            removed = await self._cancel(
                keys=[self._line(session_id), self._entry(run_id)], args=[run_id]
            )
        return bool(removed)

    async def state(self, run_id: str) -> QueueState | None:
        client = self._client
        async with unavailable(self._where, "reading a queued run"):
            value = await client.get(self._entry(run_id))
            if value is not None:
                entry = QueueEntry.from_json(text(value))
                index: Any = await client.lpos(self._line(entry.session_id), run_id)
                if isinstance(index, int):
                    return QueueState(entry, index + 1)
            claimed = await client.get(self._claimed(run_id))
        if claimed is None:
            return None
        return QueueState(QueueEntry.from_json(text(claimed)), None)

    async def length(self, session_id: str) -> int:
        async with unavailable(self._where, "reading a session queue"):
            length: Any = await self._client.llen(self._line(session_id))
        return int(length)

    def forget_claim(self, run_id: str) -> None:
        """Claimed entries lapse on their own in Redis."""
