-- A pending entry may stand for several rows of one topic and kind: `payloads`, a non-empty
-- JSON array, one payload per row in order (`payload` is then unused). A pipeline batch writes
-- one entry per topic instead of one row per item and topic, and its pass deletes that one
-- entry: the rows are made once, in `feed`, where they get their offsets.
ALTER TABLE feed_pending ADD COLUMN payloads jsonb
    CONSTRAINT feed_pending_payloads_rows CHECK (
        CASE WHEN jsonb_typeof(payloads) = 'array' THEN jsonb_array_length(payloads) > 0
             ELSE payloads IS NULL END);

-- As in 0011, with each entry expanded into its rows: p_limit counts entries, the offsets
-- follow the entries' ids and, within an entry, the array's order.
CREATE OR REPLACE FUNCTION feed_number(p_topic text, p_limit integer)
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
    SELECT array_agg(q.id ORDER BY q.id), sum(q.rows) INTO ids, n FROM (
        SELECT p.id, coalesce(jsonb_array_length(p.payloads), 1) AS rows
        FROM feed_pending AS p WHERE p.topic = p_topic ORDER BY p.id LIMIT p_limit
    ) AS q;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO feed_topics AS t (topic, last_offset) VALUES (p_topic, n)
    ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + n
    RETURNING t.last_offset - n, t.epoch INTO base, ep;
    RETURN QUERY
    WITH moved AS (
        DELETE FROM feed_pending AS p WHERE p.id = ANY (ids)
        RETURNING p.id, p.kind, coalesce(p.payloads, jsonb_build_array(p.payload)) AS rows
    )
    INSERT INTO feed AS f (topic, "offset", epoch, kind, payload)
    SELECT p_topic, base + row_number() OVER (ORDER BY u.ord, e.n), ep, m.kind, e.payload
    FROM unnest(ids) WITH ORDINALITY AS u(id, ord) JOIN moved AS m ON m.id = u.id
    CROSS JOIN LATERAL jsonb_array_elements(m.rows) WITH ORDINALITY AS e(payload, n)
    RETURNING f."offset", f.epoch, f.kind, f.payload, f.created_at;
END
$$;
