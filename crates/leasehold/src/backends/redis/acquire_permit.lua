-- Grants one permit of a semaphore iff fewer than ARGV[4] of its permits are
-- live by the server's clock (TIME); takes the lowest free slot below that.
-- KEYS[1] the permits hash (field: slot; value: expiry ms:owner:token:holder),
-- KEYS[2] the permit fence, KEYS[3..5] the key's
-- mutex lock, fence and kind (claim_kind.lua, run first); ARGV[1] owner,
-- ARGV[2] ttl in ms, ARGV[3] holder label, ARGV[4] permits, ARGV[5] 'sem'.
-- Returns {token, slot, '', 0} when granted, {0, -1, holder, ms left} of the
-- permit that expires first (or of the mutex holder) when busy, {-1, -1,
-- kind, 0} when the key is a reader-writer lock. Expired slots are dropped
-- here.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local permits = tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
local live, taken = 0, {}
local first_exp, first_holder = nil, ''
local own_slot, own_token = nil, nil
for i = 1, #all, 2 do
  local exp, owner, token, holder = string.match(all[i + 1], '^(%d+):(%x+):(%d+):(.*)$')
  exp = tonumber(exp)
  if exp and exp > now then
    live = live + 1
    taken[all[i]] = true
    if owner == ARGV[1] then
      own_slot, own_token = all[i], token
    end
    if not first_exp or exp < first_exp then
      first_exp, first_holder = exp, holder
    end
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
-- The semaphore's slots and kind outlive its latest permit by the idle
-- window (idle.lua; its fence keeps the ttl it was created with).
local ms = tonumber(ARGV[2]) + IDLE_MS
if own_slot then
  -- A repeat by an owner that holds a live permit (a command re-sent after
  -- a lost reply): the same grant, its expiry from now, never a second slot.
  redis.call('HSET', KEYS[1], own_slot,
    string.format('%d:%s:%s:%s', now + tonumber(ARGV[2]), ARGV[1], own_token, ARGV[3]))
  keep_for(KEYS[1], ms)
  keep_for(KEYS[5], ms)
  return {tonumber(own_token), tonumber(own_slot), '', 0}
end
if live >= permits then
  return {0, -1, first_holder, first_exp - now}
end
local slot = 0
while taken[tostring(slot)] do
  slot = slot + 1
end
local token = next_fence(KEYS[2])
redis.call('HSET', KEYS[1], slot,
  string.format('%d:%s:%d:%s', now + tonumber(ARGV[2]), ARGV[1], token, ARGV[3]))
keep_for(KEYS[1], ms)
keep_for(KEYS[5], ms)
return {token, slot, '', 0}
