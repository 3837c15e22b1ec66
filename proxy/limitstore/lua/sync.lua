-- KEYS: gen, registry, the claims, the budgets, then (key, holds, done key) per hold.
-- ARGV: replica, expect, grace, gen_ttl, new_id, budgets, the generation last contributed
-- to, claims, done_ttl, ttl, holds, then two per budget: own (this replica's billed total),
-- expire_at; then four per hold: member (<id>|<units>), units, expire_at, always (1: a
-- request admitted without the store; 0: one reserved in the store, held again only in a
-- generation new to this replica, whose store state is gone).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local gen, reg = KEYS[1], KEYS[2]
local replica, expect, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local gen_ttl, new_id, n = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local m, done_ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local ttl, h = tonumber(ARGV[10]), tonumber(ARGV[11])
local created = 0
if redis.call('EXISTS', gen) == 0 then
  redis.call('HSET', gen, 'id', new_id, 'since', string.format('%.17g', now), 'expect', 0)
  created = 1
end
claim(3, m, done_ttl)
local fresh = redis.call('HGET', gen, 'id') ~= ARGV[7]
for i = 1, n do
  local a = 11 + (i - 1) * 2
  contribute(KEYS[2 + m + i], replica, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]))
end
-- the holds of this replica's requests in flight: taken in the store (once: a member
-- already there, or an id already ended, is left as it is), given back by their end
local first = 11 + 2 * n
for i = 1, h do
  local a = first + (i - 1) * 4
  local k, z, done = KEYS[2 + m + n + 3 * i - 2], KEYS[2 + m + n + 3 * i - 1], KEYS[2 + m + n + 3 * i]
  local member, units, expire_at = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if (ARGV[a + 4] == '1' or fresh) and redis.call('EXISTS', done) == 0 then
    if redis.call('ZADD', z, 'NX', now + ttl, member) == 1 then
      redis.call('HINCRBY', k, 'reserved', units)
      local until_ = math.max(math.ceil(expire_at), math.ceil(now + ttl) + 1)
      redis.call('EXPIREAT', k, until_)
      redis.call('EXPIREAT', z, until_)
    end
  end
end
redis.call('HSET', gen, 'c:' .. replica, '1')
-- expect: the replicas the operator declared (> 0), or, negated, those this replica last
-- counted in the registry (< 0): the generation keeps the most of each
if expect > tonumber(redis.call('HGET', gen, 'expect') or '0') then
  redis.call('HSET', gen, 'expect', expect)
elseif -expect > tonumber(redis.call('HGET', gen, 'seen') or '0') then
  redis.call('HSET', gen, 'seen', -expect)
end
redis.call('EXPIRE', gen, gen_ttl)
local done = 0
if complete(gen, reg, now, grace) then done = 1 end
return {redis.call('HGET', gen, 'id'), done, created}
