-- Takes an owner out of a key's queue, and gives back a grant handed over
-- to it that it still holds (a waiter whose wait ended without taking it):
-- the key goes on to the next live head, or is freed. Owner ids are fresh
-- per acquisition, so a lease of that owner can only be such a grant.
-- Prepended: idle.lua, fence.lua, queue.lua.
-- KEYS as release.lua; ARGV[1] owner, ARGV[2] channel, ARGV[3] the key.
-- Returns as release.lua.
drop(ARGV[1])
local current = redis.call('GET', KEYS[1])
if not (current and string.sub(current, 1, 33) == ARGV[1] .. '#') then
  if redis.call('ZCARD', KEYS[4]) == 0 then
    unmark()
  end
  return 0
end
return release_to_head(ARGV[2], ARGV[3])
