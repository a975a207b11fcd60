-- Prepended to every script that writes (docs/storage.md). The caller
-- passes the store's idle window in ms as the last ARGV (0: keep records
-- forever); it is taken off here, so each script reads its own ARGV as
-- documented there.
local IDLE_MS = tonumber(table.remove(ARGV))

-- The rule every script keeps: each record of a key lives at least the
-- idle window past the end of every lease, slot or writer mark it records.
-- Grants, renewals and marks keep it (keep_for, next_fence); a release
-- writes no ttl, since what it frees ends no later than its lease did, and
-- the records already outlive that by the window. Writes are what a script
-- costs (each is replicated and logged), so a ttl moves only when it must,
-- with half a window of slack: in steady use a key's ttl is written about
-- once per half window, and a release costs nothing here.

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

-- The next value of a fence counter, kept alive `ms` more as keep_for
-- does. A counter that did not exist (never used, or expired after its key
-- was idle for the window) starts at the server's clock in microseconds,
-- its ttl set in the same write: a fence grows by one per grant, far slower
-- than the clock, so it stays below the clock, and a counter that expired
-- an idle window after its last lease stopped below where the clock is now.
-- Kept as a string of digits (a Lua double would print 1.7e+15).
local function next_fence(key, ms)
  local fence = redis.call('INCR', key)
  if fence ~= 1 then
    keep_for(key, ms)
    return fence
  end
  local t = redis.call('TIME')
  local first = t[1] .. string.format('%06d', tonumber(t[2]))
  if IDLE_MS > 0 then
    redis.call('SET', key, first, 'PX', ms + math.floor(IDLE_MS / 2))
  else
    redis.call('SET', key, first)
  end
  return tonumber(first)
end
