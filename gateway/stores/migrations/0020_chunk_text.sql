-- Full-text search over chunks, beside the vectors: search fuses both (hybrid), so exact
-- words (names, ids, error codes) the embedding model does not know are found as well.
--
-- `tsv` is each chunk's tsvector in the `[search] language` text search configuration, written
-- by the chunk stage; `simple` (the default, used here for the chunks already stored) keeps
-- every word as written, lower-cased, unstemmed, so names and codes survive. After changing the
-- language, `UPDATE pipeline_chunks SET tsv = to_tsvector('<language>', body)` brings the
-- stored chunks to it.
ALTER TABLE pipeline_chunks ADD COLUMN tsv tsvector;
UPDATE pipeline_chunks SET tsv = to_tsvector('simple', body);
CREATE INDEX pipeline_chunks_tsv ON pipeline_chunks USING gin (tsv);
