-- Frees a permit's slot iff owner and token match, and tells waiters on the
-- mutex's channel (the payload is the key).
-- KEYS[1] the permits hash, KEYS[2] the permit fence, KEYS[3] the key's
-- kind (kept for the idle window after the last live slot, idle.lua);
-- ARGV[1] owner,
-- ARGV[2] token, ARGV[3] slot, ARGV[4] channel, ARGV[5] the key as named.
local value = redis.call('HGET', KEYS[1], ARGV[3])
if not value then
  return 0
end
local owner, token = string.match(value, '^%d+:(%x+):(%d+):')
if owner ~= ARGV[1] or token ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[3])
-- The records live for the idle window after the last slot (or waiting
-- writer's mark) left still ends.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = now
local rest = redis.call('HVALS', KEYS[1])
for i = 1, #rest do
  local exp = tonumber(string.match(rest[i], '^(%d+):'))
  if exp and exp > last then
    last = exp
  end
end
for i = 1, 3 do
  expire_in(KEYS[i], last - now + IDLE_MS)
end
-- pcall: a user without pub/sub rights still releases (waiters poll).
redis.pcall('PUBLISH', ARGV[4], ARGV[5])
return 1
