-- Extend the holds of the reservations still alive (their requests not ended) to a full
-- TTL from now, in one call for all of them: KEYS are (budget or gate hash, its holds)
-- pairs, ARGV the TTL then each pair's member. A member already swept (its hold given
-- back: the reservation expired before this) is not put back; the count extended.
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
