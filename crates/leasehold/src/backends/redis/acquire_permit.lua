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
local slot, token = own_slot, own_token
if not slot then
  if live >= permits then
    return {0, -1, first_holder, first_exp - now}
  end
  slot = 0
  while taken[tostring(slot)] do
    slot = slot + 1
  end
  token = next_fence(KEYS[2])
end
-- A grant, or a repeat by an owner that holds a live permit (a command
-- re-sent after a lost reply): the same grant, its expiry from now, never
-- a second slot. The token passes through a Lua double (exact to 2^53).
redis.call('HSET', KEYS[1], slot,
  string.format('%d', now + tonumber(ARGV[2])) .. ':' .. ARGV[1] .. ':'
    .. string.format('%d', tonumber(token)) .. ':' .. ARGV[3])
-- The semaphore's slots and kind outlive its latest permit by the idle
-- window (idle.lua; its fence keeps the ttl it was created with).
local ms = tonumber(ARGV[2]) + IDLE_MS
keep_for(KEYS[1], ms)
keep_for(KEYS[5], ms)
return {tonumber(token), tonumber(slot), '', 0}
