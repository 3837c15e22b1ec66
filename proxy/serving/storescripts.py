"""The Lua scripts the shared limiter runs in Redis/Valkey, each atomic on the store's
clock (``TIME``): a reservation, its end (settle, release or cancel), a replica's
contribution of its journal to the store (``SYNC``), the renewal of the holds of its
reservations still alive (``RENEW``), and its heartbeat in the registry (``BEAT``).

A budget's hash holds ``u:<replica>``, what that replica's journal billed in the period
(plus what it holds in reservations it made while the store was away), and ``used``,
their sum. A contribution (a reservation's or ``SYNC``'s) only ever raises the replica's
own field to its own total, so writing it twice, or after a retry, or out of order,
counts nothing twice. A settlement adds its billed units to that field in the same step
that gives its reservation back, once per id; the total a replica contributes leaves out
its settlements on their way to the store, so no settlement is in ``used`` and in
``reserved`` at once (which refused requests the budget had room for), nor lost to a
concurrent one (a total that left it out, written after it). A settlement whose sending
failed is in the replica's total from then on, and is sent again as ``late``: its hold
given back, nothing added.

The store's generation (``<ns>:gen``) says whether those fields are whole. A store found
empty (started anew, or a fresh deployment) starts a generation: until every replica the
operator declared (``--limits-replicas``) has contributed its journal (``c:<replica>``), or
a grace of three heartbeats has passed and every replica alive in the registry has, the
generation is incomplete and nothing is reserved on it: the replicas admit by their fail
mode meanwhile (``local``: in process, each by its share of what the store last told it was
left), and contribute what they admit so.

Ids: the first end of a reservation id (its done key, ``<ns>:done:<id>``, set if absent)
is the one that adds units and gives rate capacity back; a hold is given back by removing
its member, which only one end can do. A contribution that carries settlements whose
sending failed (in the replica's total from then on) sets their done keys, so that one of
them reaching the store afterwards adds nothing (it would count twice); a reservation whose
answer was lost is cancelled by its id (its done key set: if the script reaches the store
after that, it reserves nothing), and its holds given back.
"""

# complete(gen, registry, now, grace): whether the generation is whole (and mark it so).
COMPLETE = """
local function complete(gen, reg, now, grace)
  if redis.call('HGET', gen, 'complete') == '1' then return true end
  local h = redis.call('HGETALL', gen)
  if #h == 0 then return false end
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  local n = 0
  for name, _ in pairs(f) do
    if string.sub(name, 1, 2) == 'c:' then n = n + 1 end
  end
  local expect = tonumber(f.expect or '0')
  local ok = expect > 0 and n >= expect
  if not ok and n > 0 and now - tonumber(f.since) >= grace then
    ok = true
    for _, r in ipairs(redis.call('ZRANGE', reg, 0, -1)) do
      if not f['c:' .. r] then ok = false end
    end
  end
  if ok then redis.call('HSET', gen, 'complete', '1') end
  return ok
end

-- contribute(k, replica, own, expire_at): raise this replica's part of a budget to its
-- own total; the budget's used units after it.
local function contribute(k, replica, own, expire_at)
  local field = 'u:' .. replica
  local old = tonumber(redis.call('HGET', k, field) or '0')
  if own > old then
    redis.call('HSET', k, field, own)
    local used = redis.call('HINCRBY', k, 'used', own - old)
    redis.call('EXPIREAT', k, math.ceil(expire_at))
    return used
  end
  return tonumber(redis.call('HGET', k, 'used') or '0')
end
"""

# claim(first, count, ttl): the done keys KEYS[first .. first + count - 1] set (settlements
# a contribution carries: a late sending of one of them adds nothing).
CLAIM = """
local function claim(first, count, ttl)
  for i = first, first + count - 1 do redis.call('SET', KEYS[i], '1', 'EX', ttl) end
end
"""

# KEYS: gen, registry, this reservation's done key, the claims, then (key, holds) per part.
# ARGV: id, ttl, replica, parts, held_retry, gate_retry, grace, claims, done_ttl, then six
# per part: kind, amount, cost, span, own, expire_at.
RESERVE = (
    COMPLETE
    + CLAIM
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id, ttl, replica, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local held_retry, gate_retry = tonumber(ARGV[5]), tonumber(ARGV[6])
local grace, m, done_ttl = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
if redis.call('EXISTS', KEYS[3]) == 1 then return {-2} end  -- cancelled: its answer was lost
if not complete(KEYS[1], KEYS[2], now, grace) then
  return {-1, redis.call('HEXISTS', KEYS[1], 'c:' .. replica)}
end
claim(4, m, done_ttl)
local base = 3 + m
local EPS = 1e-9
local state = {}
local worst, worst_wait = 0, 0
for i = 1, n do
  local a = 9 + (i - 1) * 6
  local kind, amount, cost = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local span, own = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local k, z = KEYS[base + 2 * i - 1], KEYS[base + 2 * i]
  local wait = 0
  local s = {}
  if kind == 'r' then
    local interval = span / amount
    s.tat = tonumber(redis.call('GET', k) or '0')
    if cost > amount then
      wait = math.huge
    else
      local after = math.max(s.tat, now) + cost * interval
      if after - now > span + EPS then wait = math.max(after - span - now, 0) end
    end
  else
    local held = tonumber(redis.call('HGET', k, 'reserved') or '0')
    local expired = redis.call('ZRANGEBYSCORE', z, '-inf', now)
    if #expired > 0 then
      for _, member in ipairs(expired) do
        held = held - tonumber(string.match(member, '|(%d+)$'))
      end
      redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
      redis.call('HSET', k, 'reserved', held)
    end
    s.held = held
    s.used = 0
    if kind == 'b' then
      s.used = contribute(k, replica, own, tonumber(ARGV[a + 6]))
      if cost > amount then
        wait = math.huge
      elseif s.used + s.held + cost <= amount then
        wait = 0
      elseif s.used + cost <= amount then
        wait = math.min(held_retry, span - now)
      else
        wait = span - now
      end
    elseif held + cost > amount then
      wait = gate_retry
    end
  end
  state[i] = s
  if wait > 0 and (worst == 0 or wait > worst_wait) then worst, worst_wait = i, wait end
end
local admitted = 0
if worst == 0 then
  admitted = 1
  for i = 1, n do
    local a = 9 + (i - 1) * 6
    local kind, amount, cost = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local k, z, s = KEYS[base + 2 * i - 1], KEYS[base + 2 * i], state[i]
    if kind == 'r' then
      local span = tonumber(ARGV[a + 4])
      s.tat = math.max(s.tat, now) + cost * span / amount
      redis.call('SET', k, string.format('%.17g', s.tat), 'EXAT', math.ceil(s.tat) + 1)
    else
      s.held = redis.call('HINCRBY', k, 'reserved', cost)
      redis.call('ZADD', z, now + ttl, id .. '|' .. string.format('%d', cost))
      local until_ = math.max(math.ceil(ARGV[a + 6]), math.ceil(now + ttl) + 1)
      redis.call('EXPIREAT', k, until_)
      redis.call('EXPIREAT', z, until_)
    end
  end
end
local out = {admitted, worst, string.format('%.17g', worst_wait)}
for i = 1, n do
  local a = 9 + (i - 1) * 6
  local kind, amount = ARGV[a + 1], tonumber(ARGV[a + 2])
  local span, s = tonumber(ARGV[a + 4]), state[i]
  local remaining, reset
  if kind == 'r' then
    local interval = span / amount
    local room = span - math.max(s.tat - now, 0)
    remaining = math.max(math.min(amount, math.floor(room / interval + EPS)), 0)
    reset = math.max(s.tat - now, 0)
  elseif kind == 'b' then
    remaining = math.max(amount - s.used - s.held, 0)
    reset = span - now
  else
    remaining = math.max(amount - s.held, 0)
    reset = 0
  end
  out[#out + 1] = remaining
  out[#out + 1] = string.format('%.17g', reset)
end
return out
"""
)

# KEYS: the done key, then (key, holds) per part. ARGV: id, replica, parts, done_ttl,
# mode (settle, late, release or cancel), then five per part: kind, reserved, billed,
# interval (a rate's), expire_at. 1: this was the id's first end.
END = """
local first = redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[4])) and 1 or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id, n, mode = ARGV[1], tonumber(ARGV[3]), ARGV[5]
for i = 1, n do
  local a = 5 + (i - 1) * 5
  local kind, reserved, billed = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local interval, expire_at = tonumber(ARGV[a + 4]), ARGV[a + 5]
  local k, z = KEYS[2 * i], KEYS[2 * i + 1]
  if kind == 'r' then
    if first == 1 and mode ~= 'cancel' then  -- a cancelled one may never have taken any
      local tat = tonumber(redis.call('GET', k) or '0') - (reserved - billed) * interval
      if tat > now then
        redis.call('SET', k, string.format('%.17g', tat), 'EXAT', math.ceil(tat) + 1)
      else
        redis.call('DEL', k)
      end
    end
  else
    if redis.call('ZREM', z, id .. '|' .. string.format('%d', reserved)) == 1 then
      redis.call('HINCRBY', k, 'reserved', -reserved)
    end
    if kind == 'b' and first == 1 and mode == 'settle' and billed > 0 then
      redis.call('HINCRBY', k, 'u:' .. ARGV[2], billed)
      redis.call('HINCRBY', k, 'used', billed)
      redis.call('EXPIREAT', k, math.ceil(tonumber(expire_at)))
    end
  end
end
return first
"""

# KEYS: gen, registry, the claims, then the budgets. ARGV: replica, expect, grace,
# gen_ttl, new_id, budgets, the generation last contributed to, claims, done_ttl, then
# three per budget: own (this replica's total), fresh (its total with every request it
# has in flight: in a generation new to it), expire_at.
SYNC = (
    COMPLETE
    + CLAIM
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local gen, reg = KEYS[1], KEYS[2]
local replica, expect, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local gen_ttl, new_id, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local m, done_ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local created = 0
if redis.call('EXISTS', gen) == 0 then
  redis.call('HSET', gen, 'id', new_id, 'since', string.format('%.17g', now), 'expect', 0)
  created = 1
end
claim(3, m, done_ttl)
-- a replica that knew another generation (or none) contributes its part with the
-- requests it has in flight: their holds were in the store state that is gone
local fresh = redis.call('HGET', gen, 'id') ~= ARGV[7]
for i = 1, n do
  local a = 9 + (i - 1) * 3
  local own = tonumber(ARGV[a + 1])
  if fresh then own = tonumber(ARGV[a + 2]) end
  contribute(KEYS[2 + m + i], replica, own, tonumber(ARGV[a + 3]))
end
redis.call('HSET', gen, 'c:' .. replica, '1')
if expect > tonumber(redis.call('HGET', gen, 'expect') or '0') then
  redis.call('HSET', gen, 'expect', expect)
end
redis.call('EXPIRE', gen, gen_ttl)
local done = 0
if complete(gen, reg, now, grace) then done = 1 end
return {redis.call('HGET', gen, 'id'), done, created}
"""
)

# Extend the holds of the reservations still alive (their requests not ended) to a full
# TTL from now, in one call for all of them: KEYS are (budget or gate hash, its holds)
# pairs, ARGV the TTL then each pair's member. A member already swept (its hold given
# back: the reservation expired before this) is not put back; the count extended.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local until_ = now + tonumber(ARGV[1])
local at = math.ceil(until_) + 1
local renewed = 0
for i = 2, #ARGV do
  local k, z = KEYS[2 * i - 3], KEYS[2 * i - 2]
  if redis.call('ZSCORE', z, ARGV[i]) then
    redis.call('ZADD', z, 'XX', string.format('%.17g', until_), ARGV[i])
    redis.call('EXPIREAT', k, at, 'GT')
    redis.call('EXPIREAT', z, at, 'GT')
    renewed = renewed + 1
  end
end
return renewed
"""

# stamp(gen; run id): the generation marker remembers the server run it was made on (the
# store's ``run_id``, new at every start); a marker from another run came back with the
# store's state from before (a snapshot, an append-only file, a failover to a replica),
# which may lack what was billed since: it is dropped, so the next contribution starts a
# generation and every replica's journal is contributed again (1: dropped).
STAMP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local run = redis.call('HGET', KEYS[1], 'run')
if not run then
  redis.call('HSET', KEYS[1], 'run', ARGV[1])
  return 0
end
if run ~= ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# beat(registry, joined; replica, ttl): this replica is alive; replicas silent for ``ttl``
# are dropped. ``joined`` keeps when each replica's current stay in the registry began (a
# replica away longer than ``ttl``, or a store that lost the registry, starts a new one):
# a count read once a replica has stayed ``ttl`` includes every replica that stayed as
# long (each beats more often than that). {live replicas, joined, now}
BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local reg, joined, replica, ttl = KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2])
local last = redis.call('ZSCORE', reg, replica)
local since = redis.call('HGET', joined, replica)
if not last or not since or tonumber(last) < now - ttl then
  since = string.format('%.17g', now)
  redis.call('HSET', joined, replica, since)
end
redis.call('ZADD', reg, now, replica)
local gone = redis.call('ZRANGEBYSCORE', reg, '-inf', now - ttl)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', reg, '-inf', now - ttl)
  redis.call('HDEL', joined, unpack(gone))
end
redis.call('EXPIRE', reg, math.ceil(ttl) + 1)
redis.call('EXPIRE', joined, math.ceil(ttl) + 1)
return {redis.call('ZCARD', reg), since, string.format('%.17g', now)}
"""
