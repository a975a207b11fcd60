-- Frees the key iff its value starts with the lease's owner and token
-- (`<owner>#<token>:`, fence.lua), and tells waiters. No other record is
-- read or written: the fence keeps its own ttl. One prefix compared, no
-- string taken apart: a release costs about what a plain compare-and-delete
-- does.
-- KEYS[1] lock, KEYS[2] fence, and with the queue's keys KEYS[3] kind,
-- KEYS[4] queue, KEYS[5] waiters (queue.lua); ARGV[1] `<owner>#<token>:`,
-- ARGV[2] channel, ARGV[3] the key as the application named it.
-- Returns 1 when freed, 0 when the lease was gone, {head owner, token,
-- ticket} when the key was handed over to the head of its queue, and
-- 'queue' (nothing done) for a lease with the queued mark called without the
-- queue's keys: the caller asks again with them (a key named costs the
-- server about a quarter of a command, so a release names the queue's
-- keys only when it expects a queue).
local current = redis.call('GET', KEYS[1])
if not (current and string.sub(current, 1, #ARGV[1]) == ARGV[1]) then
  return 0
end
-- A value without the queued mark (queue.lua, grant) was written while
-- nobody waited, and nobody queued behind it since: no queue to look at.
if string.byte(current, -1) ~= 1 then
  redis.call('DEL', KEYS[1])
  -- pcall: a user without pub/sub rights still releases (waiters poll).
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
if #KEYS < 5 then
  return 'queue'
end
