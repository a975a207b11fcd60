-- The rest of release.lua (after idle.lua, fence.lua and queue.lua), for a
-- lease whose value carries the queued mark: the key goes to the live head
-- of its queue in this same step, and only the head is told; with no live
-- head it is freed and its waiters are woken as before.
local head, ticket, claim, label = live_head()
if not head then
  redis.call('DEL', KEYS[1])
  unmark()
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return {head, hand_over(head, ticket, claim, label, ARGV[2], ARGV[3]), tonumber(ticket)}
