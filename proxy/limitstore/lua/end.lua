-- KEYS: the done key, then (key, holds) per part. ARGV: id, replica, parts, done_ttl,
-- mode (settle, late, release or cancel), then five per part: kind, reserved, billed,
-- interval (a rate's), expire_at. 1: this was the id's first end.
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
