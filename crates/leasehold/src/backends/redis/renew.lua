-- Extends the lease iff owner and token match. An expired lock key is gone
-- (GET answers nil), so a late renewal can never bring it back.
-- KEYS[1] lock, KEYS[2] fence; ARGV[1] owner, ARGV[2] token, ARGV[3] ttl in ms.
-- The token check compares the fence as a string: while a lock key exists
-- the fence equals its holder's token (only a grant, or a force-release that
-- deletes the lock, moves it), and strings avoid Lua's doubles.
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 then
  -- PEXPIRE with 0 or less would delete the key: refuse instead.
  return redis.error_reply('ERR leasehold renew: ttl must be positive')
end
local current = redis.call('GET', KEYS[1])
if current and string.sub(current, 1, 32) == ARGV[1]
    and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  keep_for(KEYS[2], ttl + IDLE_MS)
  return 1
end
return 0
