-- Pipeline: documents and their derived rows, the run journal, archived dead letters.
CREATE TABLE pipeline_documents (
    item_id    text PRIMARY KEY,
    priority   text NOT NULL,
    doc_type   text NOT NULL,
    title      text,
    url        text,
    body       text NOT NULL,
    document   jsonb NOT NULL,
    stored_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per completed (item, stage), written in the same transaction as the stage's
-- results and before the completion is acknowledged in Redis.
CREATE TABLE pipeline_journal (
    item_id      text NOT NULL,
    stage        text NOT NULL CHECK (stage IN ('store', 'chunk', 'embed', 'graph')),
    worker       text NOT NULL,
    priority     text NOT NULL,
    doc_type     text NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (item_id, stage)
);
CREATE INDEX pipeline_journal_unfinished ON pipeline_journal (item_id) WHERE stage <> 'graph';

CREATE TABLE pipeline_chunks (
    item_id   text NOT NULL,
    seq       integer NOT NULL,
    body      text NOT NULL,
    embedding float8[],
    PRIMARY KEY (item_id, seq)
);
CREATE INDEX pipeline_chunks_embedded ON pipeline_chunks (item_id) WHERE embedding IS NOT NULL;

CREATE TABLE pipeline_edges (
    item_id text NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('link', 'mention', 'tag')),
    target  text NOT NULL,
    PRIMARY KEY (item_id, kind, target)
);

CREATE TABLE pipeline_dead_letters (
    id          bigserial PRIMARY KEY,
    item_id     text NOT NULL,
    stage       text NOT NULL,
    reason      text,
    entry       jsonb NOT NULL,
    document    jsonb,
    archived_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pipeline_dead_letters_item ON pipeline_dead_letters (item_id);
