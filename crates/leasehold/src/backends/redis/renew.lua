-- Extends the lease iff its value starts with the lease's owner and token
-- (`<owner>#<token>:`, fence.lua). An expired lock key is gone (GET answers
-- nil), so a late renewal can never bring it back.
-- KEYS[1] lock; ARGV[1] `<owner>#<token>:`, ARGV[2] ttl in ms.
local ttl = tonumber(ARGV[2])
if not ttl or ttl <= 0 then
  -- PEXPIRE with 0 or less would delete the key: refuse instead.
  return redis.error_reply('ERR leasehold renew: ttl must be positive')
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
