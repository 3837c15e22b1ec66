-- KEYS: gen, registry, this reservation's done key, the claims, then (key, holds) per part.
-- ARGV: id, ttl, replica, parts, held_retry, gate_retry, grace, claims, done_ttl, then six
-- per part: kind, amount, cost, span, own, expire_at.
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
