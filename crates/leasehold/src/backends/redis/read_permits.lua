-- The server's time in ms and a semaphore's slots, read in one step.
-- KEYS[1] the permits hash, KEYS[2] the permit fence (unused: the keys of
-- every permit script are the same pair). Returns {now, slot, value, ...}.
local t = redis.call('TIME')
local out = {string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do
  out[#out + 1] = all[i]
end
return out
