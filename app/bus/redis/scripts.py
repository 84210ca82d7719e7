"""The Lua scripts of the Redis bus: each check-and-write is one atomic step on the server.

Values and their layout (see ``app.bus.redis`` for the key names):

- a session lock is a string ``"<token> <holder>"``; ``token`` comes from one ``INCR``
  counter shared by every session, so it only grows, across sessions and workers (and across
  a loss of Redis's data: ``_NEXT_TOKEN``);
- a log's meta hash has ``session``, ``fence`` (the highest token that wrote), ``last`` (the
  last seq) and ``sealed`` (``1`` once the terminal event is in);
- a log's stream entries have the id ``<seq>-0`` (our own counter, so a reader's cursor *is*
  the stream id) and the fields ``t`` (the SSE type) and ``f`` (the encoded frame).

Every script returns small integers as status codes rather than raising, so that the Python
side maps each to one of the bus's own errors.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACQUIRE",
    "APPEND",
    "APPEND_DUPLICATE",
    "APPEND_NO_LOG",
    "APPEND_OK",
    "APPEND_SEALED",
    "APPEND_SEQ",
    "APPEND_STALE",
    "CLAIM",
    "CLAIM_UNDO",
    "CREATE",
    "READ",
    "RELEASE",
    "RENEW",
    "UNREGISTER",
]

# The next fencing token from the counter at ``key``. A counter that is missing (a Redis that
# restarted empty, or FLUSHALL) begins again at the server's clock in microseconds, not at 1:
# the store keeps the tokens it was written with and refuses lower ones, so tokens must keep
# rising across a loss of Redis's data (a counter that issued fewer than one token per
# microsecond since it began is passed). Tokens are formatted with %d: Lua prints numbers
# past 10^14 in exponent form.
_NEXT_TOKEN: Final = """
local function next_token(key)
  if redis.call('EXISTS', key) == 0 then
    local now = redis.call('TIME')
    redis.call('SET', key, now[1] .. string.format('%06d', tonumber(now[2])))
  end
  return redis.call('INCR', key)
end
"""

# KEYS: lock, fence counter. ARGV: holder, ttl (ms), exclusive (1 or 0).
# The token of the new lease; the same token again when ``holder`` already holds the lock (a
# call retried after its answer was lost) unless ``exclusive``; nil when someone else holds
# it. A resumed run's id is a holder two workers may both name: one of them must not be
# handed the other's live lease (it would release it on giving up).
ACQUIRE: Final = (
    _NEXT_TOKEN
    + """
local current = redis.call('GET', KEYS[1])
if current then
  local space = string.find(current, ' ', 1, true)
  if ARGV[3] ~= '1' and space and string.sub(current, space + 1) == ARGV[1] then
    return tonumber(string.sub(current, 1, space - 1))
  end
  return false
end
local token = next_token(KEYS[2])
redis.call('SET', KEYS[1], string.format('%d', token) .. ' ' .. ARGV[1], 'NX', 'PX', ARGV[2])
return token
"""
)

# KEYS: lock, route of the holder, meta of the holder's log, stream of the holder's log.
# ARGV: lock value, lease ttl (ms), live log ttl (ms).
# 1 if the lease was extended (with the run's route, and its log while unsealed), else 0.
RENEW: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('HGET', KEYS[3], 'sealed') == '0' then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
return 1
"""

# KEYS: lock. ARGV: lock value. Deletes the lock only if this lease still holds it.
RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: route. ARGV: worker id. Deletes the route only if it still names this worker.
UNREGISTER: Final = RELEASE

# KEYS: meta, live set[, route]. ARGV: session id, fence, live ttl (ms), run id, the seq the
# log goes on after, or 'new' for a new run[, worker id, route ttl (ms)]. 1 if created (and,
# given a route, the run routed to that worker), 0 if the log exists already (and nothing
# changed). A log that goes on after a seq (a run resumed from its checkpoint once Redis lost
# its log; 0 for a checkpoint taken before the run's first event) keeps it as ``restarted``:
# READ starts a reader whose cursor is past it from there.
CREATE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local last = ARGV[5]
if last == 'new' then
  last = '0'
else
  redis.call('HSET', KEYS[1], 'restarted', last)
end
redis.call('HSET', KEYS[1], 'session', ARGV[1], 'fence', ARGV[2], 'last', last, 'sealed', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[6], 'PX', ARGV[7])
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000),
  ARGV[4])
return 1
"""

# KEYS: lock, fence counter, meta, live set, route. ARGV: holder (the new run's id), lease ttl
# (ms), session id, live ttl (ms), worker id, route ttl (ms).
#
# ACQUIRE and CREATE (with the route) in one step, for a run that starts at once: the lease's
# token, with the run's log started under that fence and the run routed to the worker; nil,
# and nothing changed, when someone else holds the lock; -1 when the run has a log already.
# The same token again when ``holder`` holds the lock already: this call, retried after its
# answer was lost (the log and the route were written with the lock, in the same step).
CLAIM: Final = (
    _NEXT_TOKEN
    + """
local current = redis.call('GET', KEYS[1])
if current then
  local space = string.find(current, ' ', 1, true)
  if space and string.sub(current, space + 1) == ARGV[1] then
    return tonumber(string.sub(current, 1, space - 1))
  end
  return false
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return -1
end
local token = next_token(KEYS[2])
local text = string.format('%d', token)
redis.call('SET', KEYS[1], text .. ' ' .. ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[3], 'session', ARGV[3], 'fence', text, 'last', 0, 'sealed', 0)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('SET', KEYS[5], ARGV[5], 'PX', ARGV[6])
local now = redis.call('TIME')
redis.call('ZADD', KEYS[4], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000),
  ARGV[1])
return token
"""
)

# KEYS: lock, meta, stream, live set, route. ARGV: holder (the run's id), worker id.
# Undoes a CLAIM whose answer never came (cancelled, or Redis unreachable), if it ran: the
# lock if ``holder`` still has it, the log if nothing was appended to it, the route if it
# still names this worker. The run's id is new, so nothing else can have used these keys.
CLAIM_UNDO: Final = """
local current = redis.call('GET', KEYS[1])
if current then
  local space = string.find(current, ' ', 1, true)
  if space and string.sub(current, space + 1) == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
end
if redis.call('HGET', KEYS[2], 'last') == '0' then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
if redis.call('GET', KEYS[5]) == ARGV[2] then
  redis.call('DEL', KEYS[5])
end
return 1
"""

APPEND_OK: Final = 1
APPEND_DUPLICATE: Final = 0
APPEND_NO_LOG: Final = -1
APPEND_STALE: Final = -2
APPEND_SEALED: Final = -3
APPEND_SEQ: Final = -4

# KEYS: none (see below). ARGV: the key prefix, max events, sealed ttl (ms), the header, the
# frames. The header holds seven fields a run, each field ended by RS (\30): its id, its
# session (for a terminal batch, whose lock it releases; else empty), fence, terminal (0/1: the
# batch's last event is terminal), the first event's seq, the events' types and their frames'
# lengths (both with US, \31, between items). The frames of every batch follow one another in
# the last argument. The answer: one status per run (APPEND_*), in order, in one string with a
# space between them (one reply to parse rather than one a run).
#
# One call appends the batches of several runs (``app.bus.redis.writer``), in five arguments
# whatever their number: encoding a command's arguments is most of what a call costs the worker,
# so a few long ones cost far less than many short ones. The keys are named from the prefix
# here rather than passed: a call writes the logs of many runs, which Redis Cluster would
# refuse anyway (one Redis, or one Redis per shard of runs, as docs/deploy.md describes).
#
# Each batch is the consecutive events one writer queued for one run with one fence, all or
# none (every check is made before the batch's first write, so a refused batch leaves its log
# as it was; the other runs' batches do not depend on it). The fence check is what keeps a
# worker that lost its lease from writing after whoever took over (with a higher token) wrote
# the run's end. The same batch sent twice by the same writer (a call retried after its answer
# was lost: its last seq is the log's last, its fence the log's) is accepted once and answered
# APPEND_DUPLICATE. A terminal event can only be a batch's last: it seals the log, gives it its
# TTL, and ends the run's hold in the same step: the session lock taken with this fence is
# released and the route dropped, so a reader that sees the end never finds the session still
# busy.
APPEND: Final = """
local prefix = ARGV[1]
local function fields(text, sep)
  local found = {}
  local start = 1
  while start <= #text do
    local stop = string.find(text, sep, start, true)
    if not stop then
      stop = #text + 1
    end
    found[#found + 1] = string.sub(text, start, stop - 1)
    start = stop + 1
  end
  return found
end

local frames = ARGV[5]
local offset = 1
local function append(run_id, session, fence_text, terminal, first, types, sizes)
  local meta_key = prefix .. 'meta:' .. run_id
  local log_key = prefix .. 'log:' .. run_id
  local meta = redis.call('HMGET', meta_key, 'fence', 'last', 'sealed')
  if not meta[1] then
    return -1
  end
  local fence = tonumber(fence_text)
  local stored = tonumber(meta[1])
  if fence < stored then
    return -2
  end
  local final = first + #types - 1
  local last = tonumber(meta[2])
  if final == last and fence == stored and last > 0 then
    return 0
  end
  if meta[3] == '1' then
    return -3
  end
  if first ~= last + 1 then
    return -4
  end
  local at = offset
  for index = 1, #types do
    local stop = at + tonumber(sizes[index])
    redis.call('XADD', log_key, 'MAXLEN', '~', ARGV[2], (first + index - 1) .. '-0',
      't', types[index], 'f', string.sub(frames, at, stop - 1))
    at = stop
  end
  if terminal == '1' then
    redis.call('HSET', meta_key, 'fence', fence_text, 'last', final, 'sealed', 1)
    redis.call('PEXPIRE', meta_key, ARGV[3])
    redis.call('PEXPIRE', log_key, ARGV[3])
    redis.call('ZREM', prefix .. 'live', run_id)
    local lock_key = prefix .. 'lock:' .. session
    local lock = redis.call('GET', lock_key)
    if lock and string.sub(lock, 1, string.len(fence_text) + 1) == fence_text .. ' ' then
      redis.call('DEL', lock_key)
    end
    redis.call('DEL', prefix .. 'route:' .. run_id)
  else
    redis.call('HSET', meta_key, 'fence', fence_text, 'last', final)
    if first == 1 then
      local ttl = redis.call('PTTL', meta_key)
      if ttl > 0 then
        redis.call('PEXPIRE', log_key, ttl)
      end
    end
  end
  return 1
end

local header = fields(ARGV[4], '\\30')
local statuses = {}
for at = 1, #header - 6, 7 do
  local types = fields(header[at + 5], '\\31')
  local sizes = fields(header[at + 6], '\\31')
  statuses[#statuses + 1] = append(header[at], header[at + 1], header[at + 2],
    header[at + 3], tonumber(header[at + 4]), types, sizes)
  -- the next batch's frames follow this one's, whether this one was written or not
  for index = 1, #sizes do
    offset = offset + tonumber(sizes[index])
  end
end
return table.concat(statuses, ' ')
"""

# KEYS: meta, stream. ARGV: cursor (the last seq read), count, rebase (1 for a new reader).
# {0} when there is no log; else {1, last, sealed, entries after the cursor (at most count),
# the cursor read from}. A new reader whose cursor is past the seq a restarted log goes on
# after (CREATE) may count events of the log Redis lost, numbered as this one numbers others:
# it reads this log from its start (its run.resumed says which of the reader's text to drop).
READ: Final = """
local meta = redis.call('HMGET', KEYS[1], 'last', 'sealed', 'restarted')
if not meta[1] then
  return {0}
end
local cursor = tonumber(ARGV[1])
if ARGV[3] == '1' and meta[3] and cursor > tonumber(meta[3]) then
  cursor = tonumber(meta[3])
end
local from = '(' .. string.format('%d', cursor) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], from, '+', 'COUNT', ARGV[2])
return {1, tonumber(meta[1]), tonumber(meta[2]), entries, cursor}
"""
