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
