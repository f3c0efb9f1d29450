-- Events published with an event_id (POST /v1/topics/{topic}/events): the offset the first
-- one got, so a repeat within the dedup window is answered "duplicate" with that offset.
-- The claim is taken in the transaction that appends the feed row, so two concurrent
-- publishes of one id make one row: the second waits on the first's unique entry.
-- Entries older than the window are replaced by a new publish of the id, and purged.
CREATE TABLE feed_events (
    topic      text        NOT NULL,
    event_id   text        NOT NULL,
    "offset"   bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, event_id)
);
CREATE INDEX feed_events_created_at ON feed_events (created_at);
