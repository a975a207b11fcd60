-- Prepended to every script that writes (docs/storage.md). The caller
-- passes the store's idle window in ms as the last ARGV (0: keep records
-- forever); it is taken off here, so each script reads its own ARGV as
-- documented there.
local IDLE_MS = tonumber(table.remove(ARGV))

-- The rule every script keeps: a key's lock, slots hash and kind live at
-- least the idle window past the end of every lease, slot or writer mark
-- they record. The lock key's own expiry is its lease (PX); grants,
-- renewals and marks keep the hash and kind alive (keep_for). A release
-- writes no ttl, since what it frees ends no later than its lease did.
-- Writes are what a script costs (each is replicated and logged), so a
-- ttl moves only when it must, with half a window of slack: in steady use
-- a key's ttl is written about once per half window.
--
-- A fence counter is different: no grant needs it to live, since a lease
-- carries its token in its own record (the lock key's value, a slot), so
-- it gets one ttl when created, one and a half windows, and no script
-- reads or moves it after. When it is gone the next grant starts it again
-- at the server's clock (next_fence), above every token it handed out.

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

-- The holder label and token of a lock key's value, `<owner>:<label>#<token>`;
-- no token from a value an earlier version wrote (`<owner>:<label>`, its
-- token in the fence key).
local function lock_value(value)
  local label, token = string.match(value, '^%x+:(.*)#(%d+)$')
  if label then
    return label, token
  end
  return string.sub(value, 34), nil
end
