-- Prepended to every script that writes (docs/storage.md). The caller
-- passes the store's idle window in ms as the last ARGV (0: keep records
-- forever); it is taken off here, so each script reads its own ARGV as
-- documented there.
local IDLE_MS = tonumber(table.remove(ARGV))

-- Writes are what a script costs (each is replicated and logged), so the
-- ttls below move only when they must, with half a window of slack: in
-- steady use a key's ttl is written about once per half window, not on
-- every grant and release.

-- Makes `key` live at least `ms` - IDLE_MS/2 more, setting `ms` when it
-- does not (never shortens its life; a key without a ttl, written by an
-- earlier version, gets one). A grant passes the lease plus the window, so
-- the records outlive the lease by at least half a window. Nothing with an
-- idle window of 0 (never), or for a key that does not exist.
local function keep_for(key, ms)
  if IDLE_MS <= 0 then
    return
  end
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ms - IDLE_MS / 2) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- A release: `key` lives between `ms` and `ms` + IDLE_MS/2 more (nothing
-- it guarded needs it longer; a key in steady use keeps its records).
-- Nothing with an idle window of 0 (never), or for a key that does not
-- exist.
local function expire_in(key, ms)
  if IDLE_MS <= 0 then
    return
  end
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and (left < ms or left > ms + IDLE_MS / 2)) then
    redis.call('PEXPIRE', key, ms + math.floor(IDLE_MS / 2))
  end
end

-- The next value of a fence counter. A counter that did not exist (never
-- used, or expired after its key was idle for the window) starts at the
-- server's clock in microseconds: a fence grows by one per grant, far
-- slower than the clock, so it stays below the clock, and a counter that
-- expired an idle window ago stopped below where the clock is now. Kept as
-- a string of digits (a Lua double would print 1.7e+15).
local function next_fence(key)
  local fence = redis.call('INCR', key)
  if fence == 1 then
    local t = redis.call('TIME')
    local first = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('SET', key, first)
    return tonumber(first)
  end
  return fence
end
