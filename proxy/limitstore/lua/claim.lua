-- claim(first, count, ttl): the done keys KEYS[first .. first + count - 1] set (settlements
-- a contribution carries: a late sending of one of them adds nothing).
local function claim(first, count, ttl)
  for i = first, first + count - 1 do redis.call('SET', KEYS[i], '1', 'EX', ttl) end
end
