-- KEYS: gen, registry, the claims, then the budgets. ARGV: replica, expect, grace,
-- gen_ttl, new_id, budgets, the generation last contributed to, claims, done_ttl, then
-- three per budget: own (this replica's total), fresh (its total with every request it
-- has in flight: in a generation new to it), expire_at.
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
