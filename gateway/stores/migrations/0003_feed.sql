-- The durable feed: per-topic offsets that rise by exactly one.
--
-- feed_topics is the per-topic counter. Appending does
--   INSERT ... ON CONFLICT (topic) DO UPDATE SET last_offset = last_offset + 1 RETURNING
-- which row-locks the topic until the inserting transaction commits: a second writer to
-- the same topic waits, so commit order is offset order and a poller never skips a hole.
-- epoch rises when the topic is reset (rows deleted, offsets restart at 1); trimmed_through
-- is the highest offset removed by retention (rows 1..trimmed_through are gone).
CREATE TABLE feed_topics (
    topic           text PRIMARY KEY,
    epoch           integer NOT NULL DEFAULT 1,
    last_offset     bigint  NOT NULL DEFAULT 0,
    trimmed_through bigint  NOT NULL DEFAULT 0
);

CREATE TABLE feed (
    topic      text        NOT NULL,
    "offset"   bigint      NOT NULL CHECK ("offset" > 0),
    epoch      integer     NOT NULL,
    kind       text        NOT NULL,
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topic, "offset")
);

-- Retention by age looks for the newest expired row of each topic.
CREATE INDEX feed_topic_created_at ON feed (topic, created_at);
