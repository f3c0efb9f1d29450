-- Vectors: which embedder made each chunk's vector, and pgvector where the server has it.
--
-- `embedder` names the model and the dimensions ("local:l2_supercat@256"); search reads only
-- the configured embedder's vectors, so two models' vectors are never compared. Vectors of
-- earlier versions (feature hashing) are marked as such: `gateway reembed` replaces them.
ALTER TABLE pipeline_chunks ADD COLUMN embedder text;
UPDATE pipeline_chunks SET embedder = 'hashing@256' WHERE embedding IS NOT NULL;
CREATE INDEX pipeline_chunks_embedder ON pipeline_chunks (embedder, item_id);

-- With the `vector` extension the column becomes `vector` (no fixed dimensions: each
-- embedder gets its own partial HNSW index on `embedding::vector(<dims>)`, created by the
-- embed stage when that embedder first writes). Without it, or with the database setting
-- `gateway.pgvector = off`, the column stays float8[] and search scans. Lacking the
-- privilege to create the extension is not an error either: the scan is kept.
DO $$
BEGIN
    IF coalesce(current_setting('gateway.pgvector', true), 'on') <> 'off'
       AND EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS vector;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'pgvector: no privilege to CREATE EXTENSION vector; search scans';
            RETURN;
        END;
        ALTER TABLE pipeline_chunks ALTER COLUMN embedding TYPE vector
            USING embedding::real[]::vector;
    END IF;
END $$;
