-- The rest of acquire.lua (after queue.lua), for a key whose kind says it
-- may have waiters, or a busy try that queues; `kind` is acquire.lua's.
local queued = #ARGV >= 9

-- Enters the requester in the queue after every entry there, or renews its
-- live entry (ticket and expiry) in place; a dead one goes to the back.
-- The queue's keys and the kind's 'q' live at least as long as every live
-- entry: twice this entry's lease when less is left, so a waiter's renewals
-- (about every third of its lease) move the ttls every few tries only.
local function enqueue()
  local ttl = tonumber(ARGV[6])
  local old = redis.call('HGET', KEYS[5], ARGV[1])
  local exp = old and entry_of(old)
  if not (exp and exp > NOW) then
    if old then
      redis.call('ZREM', KEYS[4], ARGV[1])
    end
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[4], last[2] and tonumber(last[2]) + 1 or 1, ARGV[1])
  end
  redis.call('HSET', KEYS[5], ARGV[1],
    string.format('%d', NOW + ttl) .. ':' .. ARGV[7] .. ':' .. ARGV[8] .. ':' .. ARGV[3])
  local left = redis.call('PTTL', KEYS[4])
  if kind ~= 'q' or left < ttl then
    redis.call('PEXPIRE', KEYS[4], 2 * ttl)
    redis.call('PEXPIRE', KEYS[5], 2 * ttl)
    redis.call('SET', KEYS[3], 'q', 'PX', 2 * ttl)
    kind = 'q'
  end
end

local current = redis.call('GET', KEYS[1])
if current then
  local holder, held = lock_value(current)
  if held and string.sub(current, 1, 32) == ARGV[1] then
    -- A repeat by the holder, or the head claiming the grant handed over
    -- to it: the same grant, its expiry from now.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {tonumber(held), '', 0}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if queued then
    enqueue()
    -- The holder's release must look at the queue (release.lua); APPEND
    -- keeps the lease's expiry.
    if string.byte(current, -1) ~= 1 then
      redis.call('APPEND', KEYS[1], '\1')
    end
  end
  return {0, holder, pttl}
end

-- Free: the live head's, if that is somebody else.
local head, ticket, claim, label = live_head()
if head and head ~= ARGV[1] then
  if queued then
    enqueue()
  end
  local token = hand_over(head, ticket, claim, label, ARGV[4], ARGV[5])
  return {0, label, tonumber(claim), head, token, tonumber(ticket)}
end
-- Nobody ahead: the requester's, and its entry goes.
if head then
  drop(ARGV[1])
end
return {grant(ARGV[1], ARGV[3], ARGV[2]), '', 0}
