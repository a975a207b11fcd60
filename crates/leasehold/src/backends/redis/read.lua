-- Reads one key's lease in one step, so holder, ttl and token belong
-- together: on a cluster, where a MULTI/EXEC in a slot that just moved is
-- aborted rather than redirected, while a script is redirected like any
-- command.
-- KEYS[1] lock, KEYS[2] fence. Returns {lock value or nil, PTTL, fence or nil}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
