-- Admin break: frees the key whoever holds it and bumps the fence, so the
-- evicted holder's token is stale everywhere.
-- KEYS[1] lock, KEYS[2] fence; ARGV[1] channel, ARGV[2] the key.
-- Returns 1 if a live lease was broken.
local live = redis.call('DEL', KEYS[1])
-- A key never granted has no fence to protect; do not create records for
-- names an admin merely typed.
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[2])
end
if live == 1 then
  -- pcall: a user without pub/sub rights still breaks locks (waiters poll).
  redis.pcall('PUBLISH', ARGV[1], ARGV[2])
end
return live
