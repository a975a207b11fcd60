-- One attempt at a reader-writer lock by the server's clock (TIME); see
-- docs/rw-lock.md. KEYS[1] the lock's hash (field: a reader's slot, the
-- writer's slot ARGV[6], or 'mark' for a waiting writer; value: expiry
-- ms:owner:token:holder, token 0 for the mark), KEYS[2] its fence,
-- KEYS[3..5] the key's mutex lock, fence and kind
-- (claim_kind.lua, run first); ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3]
-- holder label, ARGV[4] 'r' or 'w', ARGV[5] the mark's life in ms (0: a
-- writer that does not wait leaves none), ARGV[6] the writer's slot, ARGV[7]
-- the most readers, ARGV[8] 'rw'.
-- A reader is refused while the writer or another owner's mark is live; a
-- writer while anybody holds or another owner's mark is live, and it marks
-- the lock if only readers hold. Returns {token, slot, '', 0} when granted,
-- {0, -1, holder, ms left} of the first to expire (not our own mark) when
-- busy (or the mutex holder's), {-1, -1, kind, 0} when the key is a
-- semaphore. Expired fields are dropped here.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local writer_slot = ARGV[6]
local all = redis.call('HGETALL', KEYS[1])
local readers, writer, others_mark, taken = 0, false, false, {}
local first_exp, first_holder = nil, ''
local own_slot, own_token = nil, nil
for i = 1, #all, 2 do
  local exp, owner, token, holder = string.match(all[i + 1], '^(%d+):(%x+):(%d+):(.*)$')
  exp = tonumber(exp)
  if exp and exp > now then
    local own_mark = all[i] == 'mark' and owner == ARGV[1]
    if owner == ARGV[1] and all[i] ~= 'mark'
        and (all[i] == writer_slot) == (ARGV[4] == 'w') then
      own_slot, own_token = all[i], token
    end
    if all[i] == 'mark' then
      others_mark = others_mark or not own_mark
    elseif all[i] == writer_slot then
      writer = true
    else
      readers = readers + 1
      taken[all[i]] = true
    end
    if not own_mark and (not first_exp or exp < first_exp) then
      first_exp, first_holder = exp, holder
    end
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
local function busy()
  return {0, -1, first_holder, (first_exp or now) - now}
end
-- The lock's records (slots and mark, kind) outlive its latest
-- grant or mark by the idle window (idle.lua).
local function kept(ms)
  keep_for(KEYS[1], ms + IDLE_MS)
  keep_for(KEYS[5], ms + IDLE_MS)
end
if own_slot then
  -- A repeat by an owner whose grant on this side is live (a command
  -- re-sent after a lost reply): the same grant, its expiry from now.
  redis.call('HSET', KEYS[1], own_slot,
    string.format('%d', now + tonumber(ARGV[2])) .. ':' .. ARGV[1] .. ':' .. own_token .. ':' .. ARGV[3])
  kept(tonumber(ARGV[2]))
  return {tonumber(own_token), tonumber(own_slot), '', 0}
end
if writer or others_mark then
  return busy()
end
local slot
if ARGV[4] == 'r' then
  if readers >= tonumber(ARGV[7]) then
    return busy()
  end
  slot = 0
  while taken[tostring(slot)] do
    slot = slot + 1
  end
else
  if readers > 0 then
    if tonumber(ARGV[5]) > 0 then
      redis.call('HSET', KEYS[1], 'mark',
        string.format('%d', now + tonumber(ARGV[5])) .. ':' .. ARGV[1] .. ':0:' .. ARGV[3])
      kept(tonumber(ARGV[5]))
    end
    return busy()
  end
  redis.call('HDEL', KEYS[1], 'mark')
  slot = tonumber(writer_slot)
end
local token = next_fence(KEYS[2])
redis.call('HSET', KEYS[1], slot,
  string.format('%d', now + tonumber(ARGV[2])) .. ':' .. ARGV[1] .. ':'
    .. string.format('%d', token) .. ':' .. ARGV[3])
kept(tonumber(ARGV[2]))
return {token, slot, '', 0}
