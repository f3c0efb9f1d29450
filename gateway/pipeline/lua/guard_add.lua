-- GUARD_ADD: ADD unless a guard key exists, as one atomic call. Only on a single instance (or
-- a Sentinel primary): on a cluster the guard key is outside the pipeline's slot.
-- Assembled by gateway/pipeline/scripts.py as: prelude, add.lua wrapped in add_item(), this.
-- The guard is a mark whose presence forbids the write, e.g. the revocation mark of the
-- credential submitting the item: checking it here costs the request no round trip of its own.
-- KEYS: ADD's six keys, then the guard key. ARGV: ADD's thirteen arguments.
-- Returns -1 when the guard exists (nothing written), else ADD's answer.
if redis.call('EXISTS', KEYS[7]) == 1 then return -1 end
return add_item()
