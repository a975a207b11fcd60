-- Frees a permit's slot iff owner and token match, and tells waiters on the
-- mutex's channel (the payload is the key). The records' ttls stay: they
-- already outlive every slot and mark by the idle window (idle.lua).
-- KEYS[1] the permits hash, KEYS[2] the permit fence, KEYS[3] the key's
-- kind; ARGV[1] owner, ARGV[2] token, ARGV[3] slot, ARGV[4] channel,
-- ARGV[5] the key as named.
local value = redis.call('HGET', KEYS[1], ARGV[3])
if not value then
  return 0
end
local owner, token = string.match(value, '^%d+:(%x+):(%d+):')
if owner ~= ARGV[1] or token ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[3])
-- pcall: a user without pub/sub rights still releases (waiters poll).
redis.pcall('PUBLISH', ARGV[4], ARGV[5])
return 1
