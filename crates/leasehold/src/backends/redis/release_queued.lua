-- The rest of release.lua (after idle.lua, fence.lua and queue.lua), for a
-- lease whose value carries the queued mark: the key goes to the live head
-- of its queue in this same step, and only the head is told; with no live
-- head it is freed and its waiters are woken as before.
return release_to_head(ARGV[2], ARGV[3])
