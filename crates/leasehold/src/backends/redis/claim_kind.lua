-- The kind claim every permit script starts with (prepended to
-- acquire_permit.lua and acquire_rw.lua: one script, one atomic step).
-- KEYS[3] the key's mutex lock, KEYS[4] its mutex fence, KEYS[5] its kind;
-- KEYS[2] the fence of this family (semaphore or reader-writer lock);
-- the ARGV before the idle window the kind asked for ('rw' or 'sem'). The kind key lives as
-- long as the family's records (keep_for in the acquire scripts).
-- A key keeps the kind it was first used as; a mutex key that nobody holds
-- becomes a reader-writer lock or a semaphore on first such use, its mutex
-- fence carried into this family's fence so the key's tokens keep rising.
do
  local wanted = ARGV[#ARGV - 1]
  local kind = redis.call('GET', KEYS[5])
  if kind == 'q' then
    -- A mutex that has (or had) waiters queued (acquire_queued.lua): a
    -- mutex all the same. Its waiters find the new kind at their next try.
    kind = nil
  end
  if kind and kind ~= wanted then
    return {-1, -1, kind, 0}
  end
  if not kind then
    local holder = redis.call('GET', KEYS[3])
    if holder then
      -- A live mutex holder: busy, naming it (its release wakes us).
      return {0, -1, (lock_value(holder)), redis.call('PTTL', KEYS[3])}
    end
    redis.call('SET', KEYS[5], wanted)
    -- Strings, not numbers: fences pass Lua doubles only to compare.
    local fence = redis.call('GET', KEYS[4])
    local own = redis.call('GET', KEYS[2])
    if fence and not own and IDLE_MS > 0 then
      -- Created here: the ttl of a new fence (idle.lua).
      redis.call('SET', KEYS[2], fence, 'PX', IDLE_MS + math.floor(IDLE_MS / 2))
    elseif fence and tonumber(fence) > tonumber(own or '0') then
      -- KEEPTTL: a fence keeps the one ttl it was created with.
      redis.call('SET', KEYS[2], fence, 'KEEPTTL')
    end
  end
end
