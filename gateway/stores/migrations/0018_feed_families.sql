-- Numbering a topic numbers its family: the topic and every topic under it (`<topic>:...`),
-- in one transaction. The pipeline writes each completion twice, on `pipeline` (the
-- operators' topic) and on `pipeline:<owner>`; its writers then ask for one pass of
-- `pipeline`, which numbers both, so the owners' topics cost no numbering transaction (and
-- no commit) of their own.
--
-- The pass takes the root's lock, then each topic's (feed_number's), topics in sorted order,
-- each under its own lock looking at its pending rows afresh: a pass of a single topic of the
-- family (the sweeper's) and a pass of the whole family take turns on that topic, and no two
-- passes wait for each other in a circle (every pass locks its root first, then topics below
-- it in one order).
CREATE FUNCTION feed_number_family(p_topic text, p_limit integer)
RETURNS TABLE (feed_topic text, feed_offset bigint, feed_epoch integer, feed_kind text,
               feed_payload jsonb, feed_created_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    PERFORM feed_topic_lock(p_topic);
    FOR t IN
        SELECT DISTINCT p.topic FROM feed_pending AS p
        WHERE p.topic = p_topic OR p.topic ^@ (p_topic || ':')
        ORDER BY 1
    LOOP
        RETURN QUERY SELECT t, n.feed_offset, n.feed_epoch, n.feed_kind, n.feed_payload,
                            n.feed_created_at
                     FROM feed_number(t, p_limit) AS n;
    END LOOP;
END
$$;
