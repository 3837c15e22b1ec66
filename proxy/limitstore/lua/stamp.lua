-- stamp(gen; run id): the generation marker remembers the server run it was made on (the
-- store's ``run_id``, new at every start); a marker from another run came back with the
-- store's state from before (a snapshot, an append-only file, a failover to a replica),
-- which may lack what was billed since: it is dropped, so the next contribution starts a
-- generation and every replica's journal is contributed again (1: dropped).
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
