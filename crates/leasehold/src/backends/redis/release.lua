-- Frees the key iff owner and token match (see renew.lua for the token
-- check), and tells waiters. The fence's ttl stays: it already outlives the
-- lease by the idle window (idle.lua).
-- KEYS[1] lock, KEYS[2] fence; ARGV[1] owner, ARGV[2] token, ARGV[3] channel,
-- ARGV[4] the key as the application named it.
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1]
    and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user without pub/sub rights still releases (waiters poll).
  redis.pcall('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
