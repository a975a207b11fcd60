-- Hands a mutex held by a lease of this process to a waiter of the same
-- process in the release (Backend::release_to): iff the lock key's value
-- starts with the lease's `<owner>#<token>:` and carries no queued mark (a
-- key with waiters queued at the store goes to the head of that queue:
-- release.lua), the key takes the next token, the waiter's owner and label
-- and its ttl, in place. One write passes the key on where a release, a
-- wake-up and the waiter's grant took two and a hop. Nothing is published:
-- the key is never free, so no waiter anywhere has anything to try.
-- KEYS[1] lock, KEYS[2] fence; ARGV[1] the released lease's
-- `<owner>#<token>:`, ARGV[2] the waiter's owner (32 hex digits), ARGV[3]
-- its ttl in ms, ARGV[4] its holder label.
-- Returns the waiter's token, or 0 when nothing changed (the lease no
-- longer holds the key, or waiters queue at the store).
local current = redis.call('GET', KEYS[1])
if not (current and string.sub(current, 1, #ARGV[1]) == ARGV[1]) then
  return 0
end
if string.byte(current, -1) == 1 then
  return 0
end
local token = next_fence(KEYS[2])
redis.call('SET', KEYS[1], ARGV[2] .. '#' .. string.format('%d', token) .. ':' .. ARGV[4],
  'PX', ARGV[3])
return token
