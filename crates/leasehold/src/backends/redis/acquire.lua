-- Grants the lease iff the key is a mutex and has no live holder. Expiry is
-- Redis's own (PX), so the server's clock decides. The lock key's value,
-- `<owner>#<token>:<holder label>`, carries the lease's token, so renewal
-- and release check its prefix, `<owner>#<token>:`, without the fence
-- (fence.lua).
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] kind, and with the queue's keys
-- KEYS[4] queue, KEYS[5] waiters (queue.lua); ARGV[1] owner (32 hex
-- digits), ARGV[2] ttl in ms, ARGV[3] holder label, and with the queue's
-- keys ARGV[4] channel, ARGV[5] the key as the application named it, and
-- for a waiter that queues ARGV[6] its entry's lease in ms, ARGV[7] its
-- ticket, ARGV[8] its claim window in ms. Every extra key or argument
-- costs the server about a quarter of a command (parsed, then pushed into
-- Lua), so a try that does not queue names only the first three and
-- three arguments, and is asked again with all if the key has a queue.
-- Returns {token, '', 0} when granted (or granted again to the same owner),
-- {0, holder, pttl} when busy, {-1, kind, 0} when the key is a
-- reader-writer lock ('rw') or a semaphore ('sem'): one key is one lock,
-- and a mutex request on such a key is the core's to redirect or refuse.
-- A free key handed over to the head of its queue answers busy, naming the
-- head: {0, label, claim window, head owner, token, ticket}. 'queue' (no
-- array, so that no token, even a corrupt one, reads as it): ask again
-- with the queue's keys (below).
--
-- The queue costs the uncontended grant nothing but one comparison: the
-- kind key, read anyway, is 'q' while the key may have waiters
-- (acquire_queued.lua keeps it so), and absent otherwise. Only a key
-- marked so, or a busy try that queues, goes on past this part.
local kind = redis.call('GET', KEYS[3])
if kind ~= 'q' then
  if kind then
    return {-1, kind, 0}
  end
  -- The token is drawn before the key is tried, so that a grant is the same
  -- three commands as before tokens moved into the lock key (GET kind, INCR,
  -- SET NX); reading the key first to spare a busy try its token cost a
  -- fourth on every grant (docs/storage.md). A busy try thus leaves a gap in
  -- the key's tokens: a fence only has to grow.
  -- The token passes through a Lua double: exact up to 2^53.
  local token = next_fence(KEYS[2])
  -- Concatenated, with one number formatted: a string.format of three
  -- fields costs about half a Redis command (each field is a sprintf).
  if redis.call('SET', KEYS[1], ARGV[1] .. '#' .. string.format('%d', token) .. ':' .. ARGV[3],
      'NX', 'PX', ARGV[2]) then
    return {token, '', 0}
  end
  -- The SET found the key, in the same atomic step: never nil here.
  local current = redis.call('GET', KEYS[1]) or ''
  local holder, held = lock_value(current)
  if held and string.sub(current, 1, 32) == ARGV[1] then
    -- A repeat by the holder (a command re-sent after a lost reply, or the
    -- core repeating its request): the same grant, its token, its expiry
    -- from now.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {tonumber(held), '', 0}
  end
  if #ARGV < 9 then
    return {0, holder, redis.call('PTTL', KEYS[1])}
  end
  -- Busy, and the try queues: acquire_queued.lua enters it.
end
-- A key that may have waiters, called with only the short path's keys
-- (lock, fence, kind: what a try that does not queue names, so that a
-- grant with nobody queued passes no more than before queues): nothing
-- done, ask again with the queue's keys.
if #KEYS < 5 then
  return 'queue'
end
