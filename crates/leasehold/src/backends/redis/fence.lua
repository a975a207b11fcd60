-- The helpers of every grant (prepended after idle.lua): the next fence,
-- and the parts of a lock key's value.

-- The next value of the fence counter `key`. A counter that did not exist
-- (never used, or expired) starts at the server's clock in microseconds,
-- its ttl of one and a half windows set by the same write: a fence grows
-- by one per grant, far slower than the clock, so a counter stays below
-- the clock, and one that expired stopped below where the clock is now
-- (docs/storage.md). A counter below 10^15 (the clock of 2001) is one an
-- earlier version counted from 1 and kept forever: it gets its ttl here.
local function next_fence(key)
  local fence = redis.call('INCR', key)
  if fence == 1 then
    local t = redis.call('TIME')
    local first = t[1] .. string.format('%06d', tonumber(t[2]))
    if IDLE_MS > 0 then
      redis.call('SET', key, first, 'PX', IDLE_MS + math.floor(IDLE_MS / 2))
    else
      redis.call('SET', key, first)
    end
    return tonumber(first)
  end
  if fence < 1e15 and IDLE_MS > 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, IDLE_MS + math.floor(IDLE_MS / 2))
  end
  return fence
end

-- The holder label and token of a lock key's value, `<owner>#<token>:<label>`;
-- no token from a value an earlier version wrote (`<owner>:<label>`, its
-- token in the fence key). A trailing byte 1 is the queued mark
-- (queue.lua), no part of the label.
local function lock_value(value)
  if string.byte(value, -1) == 1 then
    value = string.sub(value, 1, -2)
  end
  local token, label = string.match(value, '^%x+#(%d+):(.*)$')
  if token then
    return label, token
  end
  return string.sub(value, 34), nil
end
