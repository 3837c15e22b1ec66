-- complete(gen, registry, now, grace): whether the generation is whole (and mark it so):
-- every replica declared has contributed, or every replica alive in the registry has and
-- either the grace has passed or they are as many as a replica counted before.
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
  local expect, seen = tonumber(f.expect or '0'), tonumber(f.seen or '0')
  local ok = expect > 0 and n >= expect
  -- the grace waits for replicas no one can name; as many as a replica counted before
  -- need not wait for it (every replica alive in the registry is still waited for)
  local named = seen > 0 and n >= seen
  if not ok and n > 0 and (named or now - tonumber(f.since) >= grace) then
    ok = true
    for _, r in ipairs(redis.call('ZRANGE', reg, 0, -1)) do
      if not f['c:' .. r] then ok = false end
    end
  end
  if ok then redis.call('HSET', gen, 'complete', '1') end
  return ok
end
