-- Feed rows written without an offset, numbered after their writer commits.
--
-- A writer to a busy topic (the pipeline's workers) inserts its rows here inside its own
-- transaction, which therefore locks nothing shared; after the commit, feed_number moves the
-- topic's committed pending rows into feed with the next offsets. feed_number runs under a
-- per-topic transaction-scoped advisory lock and takes its look at feed_pending after it
-- holds that lock, so numbering passes of one topic run one after another, each sees every
-- row committed before it started, and each commits one contiguous block of offsets: offset
-- order is the order in which rows became visible in feed, with no hole a poller could skip.
-- The lock is held for one statement and its commit, never across a writer's transaction.
--
-- A writer that dies between its commit and the numbering loses nothing: its rows wait
-- here until the next pass for the topic (any writer's, or a process's sweep) numbers them.
CREATE TABLE feed_pending (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic      text        NOT NULL,
    kind       text        NOT NULL,
    payload    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX feed_pending_topic ON feed_pending (topic, id);

-- The lock every numbering pass and every reset of a topic takes (two-key form: its key
-- space is apart from the one-key advisory locks taken elsewhere).
CREATE FUNCTION feed_topic_lock(p_topic text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(1717920100, hashtext(p_topic))
$$;

-- Number at most p_limit pending rows of p_topic, oldest id first; returns the feed rows
-- made. Call it outside a transaction (it is one): the lock lasts until its commit.
CREATE FUNCTION feed_number(p_topic text, p_limit integer)
RETURNS TABLE (feed_offset bigint, feed_epoch integer, feed_kind text, feed_payload jsonb,
               feed_created_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    ids    bigint[];
    n      integer;
    base   bigint;
    ep     integer;
BEGIN
    PERFORM feed_topic_lock(p_topic);
    -- A new statement, so a new snapshot: it sees every row committed before the lock.
    SELECT array_agg(q.id ORDER BY q.id) INTO ids FROM (
        SELECT p.id FROM feed_pending AS p WHERE p.topic = p_topic ORDER BY p.id LIMIT p_limit
    ) AS q;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    n := cardinality(ids);
    INSERT INTO feed_topics AS t (topic, last_offset) VALUES (p_topic, n)
    ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + n
    RETURNING t.last_offset - n, t.epoch INTO base, ep;
    RETURN QUERY
    WITH moved AS (
        DELETE FROM feed_pending AS p WHERE p.id = ANY (ids)
        RETURNING p.id, p.kind, p.payload
    )
    INSERT INTO feed AS f (topic, "offset", epoch, kind, payload)
    SELECT p_topic, base + u.ord, ep, m.kind, m.payload
    FROM unnest(ids) WITH ORDINALITY AS u(id, ord) JOIN moved AS m ON m.id = u.id
    RETURNING f."offset", f.epoch, f.kind, f.payload, f.created_at;
END
$$;
