-- The Redis time (ms) of the lease under which a journal row was written: a row leased
-- before the item's current run was first seen (also Redis time) belongs to an earlier run of
-- the same item id, one leased after it to this run. One clock, so no skew margin is needed
-- (rows written before this column fall back to completed_at with one).
ALTER TABLE pipeline_journal ADD COLUMN leased_ms bigint;
