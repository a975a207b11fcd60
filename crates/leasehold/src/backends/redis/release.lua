-- Frees the key iff owner and token match (the lock key's value ends in
-- its token, fence.lua), and tells waiters. No other record is read or
-- written: the fence keeps its own ttl.
-- KEYS[1] lock; ARGV[1] owner, ARGV[2] token, ARGV[3] channel, ARGV[4] the
-- key as the application named it.
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1]
    and string.sub(current, -(#ARGV[2] + 1)) == '#' .. ARGV[2] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user without pub/sub rights still releases (waiters poll).
  redis.pcall('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
