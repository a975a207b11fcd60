-- Frees the key iff its value starts with the lease's owner and token
-- (`<owner>#<token>:`, fence.lua), and tells waiters. No other record is
-- read or written: the fence keeps its own ttl. One prefix compared, no
-- string taken apart: a release costs about what a plain compare-and-delete
-- does.
-- KEYS[1] lock; ARGV[1] `<owner>#<token>:`, ARGV[2] channel, ARGV[3] the
-- key as the application named it.
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- pcall: a user without pub/sub rights still releases (waiters poll).
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
