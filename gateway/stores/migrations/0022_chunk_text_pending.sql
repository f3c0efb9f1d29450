-- The GIN index of the chunks' words keeps new entries in a pending list until it holds
-- `gin_pending_list_limit` (4 MB by default), and every text search reads the whole list. At
-- 100k chunks, 3,000 chunks written since the last flush made a text search read 552 buffers
-- against 329 flushed; with 256 kB, 356, for inserts that took 1.5x as long (3,000 chunks in
-- batches of 100: 3.6 s against 2.4 s), a cost the chunk stage pays beside the model's.
ALTER INDEX pipeline_chunks_tsv SET (gin_pending_list_limit = 256);
