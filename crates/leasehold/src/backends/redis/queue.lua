-- The queue of a mutex's waiters (the trait's `# Contract`, issue 31;
-- docs/redis.md, "The queue"), for the scripts that enter it or hand the
-- lock to its head. Prepended after idle.lua and fence.lua, and only to
-- the part of a script that runs once the key has waiters: the fast paths
-- never make these functions.
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] kind, KEYS[4] queue (a sorted set,
-- owner to place), KEYS[5] waiters (a hash, owner to entry); one hash tag.
-- An entry is `<expiry ms>:<ticket>:<claim window ms>:<holder label>`,
-- expiry at the server's clock: an entry past it is dead, skipped and
-- removed.
local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- An entry's expiry (a number; nil for a damaged entry, which counts as
-- dead), ticket, claim window and label (text).
local function entry_of(text)
  local exp, ticket, claim, label = string.match(text, '^(%d+):(%d+):(%d+):(.*)$')
  return tonumber(exp), ticket, claim, label
end

local function drop(owner)
  redis.call('ZREM', KEYS[4], owner)
  redis.call('HDEL', KEYS[5], owner)
end

-- Nobody waits any more: the entries' hash and the kind's 'q' go, so the
-- next grant takes acquire.lua's short path and the next release
-- release.lua's. (The sorted set went with its last member.)
local function unmark()
  redis.call('DEL', KEYS[5])
  if redis.call('GET', KEYS[3]) == 'q' then
    redis.call('DEL', KEYS[3])
  end
end

-- The live head: owner, ticket, claim window, label; the dead entries in
-- front of it are removed. Nil for an empty queue.
local function live_head()
  while true do
    local owner = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
    if not owner then
      return nil
    end
    local text = redis.call('HGET', KEYS[5], owner)
    if text then
      local exp, ticket, claim, label = entry_of(text)
      if exp and exp > NOW then
        return owner, ticket, claim, label
      end
    end
    drop(owner)
  end
end

-- Grants the free lock to `owner` under `label` for `ms` with the next
-- token. While entries are left its value ends in the queued mark, byte 1
-- (a label never holds a control character), so that its release looks
-- at the queue; with none left the key is unmarked. Returns the token.
local function grant(owner, label, ms)
  local token = next_fence(KEYS[2])
  local value = owner .. '#' .. string.format('%d', token) .. ':' .. label
  if redis.call('ZCARD', KEYS[4]) > 0 then
    value = value .. '\1'
  else
    unmark()
  end
  redis.call('SET', KEYS[1], value, 'PX', ms)
  return token
end

-- Hands the free lock over to the live head: its entry goes, it is granted
-- for its claim window under its label, and it alone is told on `channel`
-- with the hand-off message (notify.rs, hand_off_message:
-- "\1<owner> <token> <ticket> <key>"). Returns the token.
local function hand_over(owner, ticket, claim, label, channel, key)
  drop(owner)
  local token = grant(owner, label, claim)
  -- pcall: a user without pub/sub rights still hands over (the head finds
  -- its grant at its next attempt).
  redis.pcall('PUBLISH', channel,
    '\1' .. owner .. ' ' .. string.format('%d', token) .. ' ' .. ticket .. ' ' .. key)
  return token
end

-- Passes the lock held until now on (release.lua and leave.lua answer
-- with this): to the live head of the queue, answered as {head, token,
-- ticket}; or, with no live head, it is freed, unmarked and its waiters
-- woken on `channel` with the released `key`, answered as 1.
local function release_to_head(channel, key)
  local head, ticket, claim, label = live_head()
  if not head then
    redis.call('DEL', KEYS[1])
    unmark()
    redis.pcall('PUBLISH', channel, key)
    return 1
  end
  return {head, hand_over(head, ticket, claim, label, channel, key), tonumber(ticket)}
end
