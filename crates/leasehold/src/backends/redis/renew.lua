-- Extends the lease iff owner and token match (the lock key's value ends
-- in its token, fence.lua). An expired lock key is gone (GET answers nil),
-- so a late renewal can never bring it back.
-- KEYS[1] lock; ARGV[1] owner, ARGV[2] token, ARGV[3] ttl in ms.
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 then
  -- PEXPIRE with 0 or less would delete the key: refuse instead.
  return redis.error_reply('ERR leasehold renew: ttl must be positive')
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1]
    and string.sub(current, -(#ARGV[2] + 1)) == '#' .. ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
