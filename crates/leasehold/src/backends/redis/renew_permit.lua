-- Extends a permit iff slot, owner and token match and it is live by the
-- server's clock: an expired permit is never revived.
-- KEYS[1] the permits hash, KEYS[2] the permit fence, KEYS[3] the key's
-- kind (kept with them for the idle window, idle.lua); ARGV[1] owner,
-- ARGV[2] token, ARGV[3] ttl in ms, ARGV[4] slot. Returns 1 if renewed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = redis.call('HGET', KEYS[1], ARGV[4])
if not value then
  return 0
end
local exp, owner, token, holder = string.match(value, '^(%d+):(%x+):(%d+):(.*)$')
if owner ~= ARGV[1] or token ~= ARGV[2] or tonumber(exp) <= now then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[4],
  string.format('%d', now + tonumber(ARGV[3])) .. ':' .. owner .. ':' .. token .. ':' .. holder)
-- The slots and the kind outlive the renewed permit by the window.
keep_for(KEYS[1], tonumber(ARGV[3]) + IDLE_MS)
keep_for(KEYS[3], tonumber(ARGV[3]) + IDLE_MS)
return 1
