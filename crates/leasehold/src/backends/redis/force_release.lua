-- Admin break: frees the key whoever holds it, whatever its kind, and bumps
-- the fence, so the evicted holders' tokens are stale everywhere.
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] kind, KEYS[4] permits hash, KEYS[5]
-- permit fence, KEYS[6] reader-writer hash, KEYS[7] its fence (one hash
-- tag); ARGV[1] channel, ARGV[2] the key.
-- Returns 1 if a live lease, permit, reader or writer was broken.
local kind = redis.call('GET', KEYS[3])
local live, fence
-- 'q': a mutex with waiters queued. Its queue stays: the waiters, woken
-- below, try again, and the first try hands the key to the head.
if not kind or kind == 'q' then
  live = redis.call('DEL', KEYS[1])
  fence = KEYS[2]
else
  -- Every slot of the key's family, and a waiting writer's mark.
  local hash = KEYS[4]
  fence = KEYS[5]
  if kind == 'rw' then
    hash, fence = KEYS[6], KEYS[7]
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local all = redis.call('HGETALL', hash)
  live = 0
  for i = 1, #all, 2 do
    local exp = tonumber(string.match(all[i + 1], '^(%d+):'))
    if all[i] ~= 'mark' and exp and exp > now then
      live = 1
    end
  end
  redis.call('DEL', hash)
end
-- A key never granted has no fence to protect; do not create records for
-- names an admin merely typed.
if redis.call('EXISTS', fence) == 1 then
  redis.call('INCR', fence)
end
if live == 1 then
  -- pcall: a user without pub/sub rights still breaks locks (waiters poll).
  redis.pcall('PUBLISH', ARGV[1], ARGV[2])
end
return live
