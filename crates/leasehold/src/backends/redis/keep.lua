-- keep_for, for the scripts that keep a semaphore's or rw lock's records
-- alive (prepended after idle.lua, whose rule it keeps).

-- Makes `key` live at least `ms` more (a lease plus IDLE_MS), setting `ms`
-- + IDLE_MS/2 when it does not (never shortening its life; a key without a
-- ttl, written by an earlier version, gets one). Nothing with an idle
-- window of 0 (never), or for a key that does not exist.
local function keep_for(key, ms)
  if IDLE_MS <= 0 then
    return
  end
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ms) then
    redis.call('PEXPIRE', key, ms + math.floor(IDLE_MS / 2))
  end
end
