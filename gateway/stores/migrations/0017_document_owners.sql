-- Documents are owned: every document and each of its chunks names the namespace it belongs
-- to (`k.<key id>` for an API key's jobs, `u.<hash of sub>` for an account's, `src.<source>`
-- for a webhook's, `ops` for the admin token's). Search filters chunks by it inside its
-- statement, so the owner is on the chunk row itself (no join in the index walk).
--
-- Documents stored before this migration get the owner their item id tells, by the rule the
-- store stage applies to new ones (`gateway.keys.document_owner`): an item id that starts with
-- `k.<hex>/` or `u.<16 hex>/` is that credential's; `webhook:<source>:<id>` is the source's;
-- anything else was submitted by the admin token (only its job ids are bare) and becomes the
-- operators' (`ops`). Nothing else records who submitted a job (the journal names workers), so
-- a bare id that an earlier version gave a key's job also becomes the operators': that fails
-- closed (no tenant reads it); an operator can hand such documents to their owner with an
-- UPDATE of both tables.
CREATE FUNCTION pg_temp.document_owner(item_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN item_id ~ '^(k\.[0-9a-f]+|u\.[0-9a-f]{16})/' THEN split_part(item_id, '/', 1)
        WHEN item_id LIKE 'webhook:%' AND split_part(item_id, ':', 2) <> ''
            THEN 'src.' || split_part(item_id, ':', 2)
        ELSE 'ops'
    END
$$;

ALTER TABLE pipeline_documents ADD COLUMN owner text;
UPDATE pipeline_documents SET owner = pg_temp.document_owner(item_id);
ALTER TABLE pipeline_documents ALTER COLUMN owner SET NOT NULL;

ALTER TABLE pipeline_chunks ADD COLUMN owner text;
UPDATE pipeline_chunks SET owner = pg_temp.document_owner(item_id);
ALTER TABLE pipeline_chunks ALTER COLUMN owner SET NOT NULL;
-- The exact pass of a search whose index walk found too few readable chunks reads a reader's
-- own chunks through this index.
CREATE INDEX pipeline_chunks_owner ON pipeline_chunks (embedder, owner);
