-- beat(registry, joined; replica, ttl): this replica is alive; replicas silent for ``ttl``
-- are dropped. ``joined`` keeps when each replica's current stay in the registry began (a
-- replica away longer than ``ttl``, or a store that lost the registry, starts a new one):
-- a count read once a replica has stayed ``ttl`` includes every replica that stayed as
-- long (each beats more often than that). {live replicas, joined, now}
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
