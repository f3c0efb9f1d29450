-- Subscriptions (notifications out): PostgreSQL is their record. A subscription follows a
-- topic (a name, or a prefix ending in '*') and delivers each row, one at a time in offset
-- order, to its destination. Its position is one cursor row per topic it has reached.
--
-- part: the delivery partition (0..63, from the id), fixed at creation; a process delivers
-- the subscriptions of the partitions whose lock: lease it holds. fence: the lease token of
-- the last process that took the subscription; a cursor write must carry it, so a process
-- that lost its lease cannot move the cursor after its successor took over. version: raised
-- by a replay, so a cursor write made for the position before the replay is refused.
CREATE TABLE subscriptions (
    id                 text        PRIMARY KEY,
    owner              text        NOT NULL,
    part               smallint    NOT NULL,
    topic              text        NOT NULL,
    kinds              text[],
    destination        jsonb       NOT NULL,
    secret             text,
    template           text,
    state              text        NOT NULL DEFAULT 'active'
                                   CHECK (state IN ('active', 'paused')),
    start_after        bigint      NOT NULL DEFAULT 0,
    version            integer     NOT NULL DEFAULT 1,
    fence              bigint      NOT NULL DEFAULT 0,
    last_error         text,
    failing_since      timestamptz,
    head_failures      integer     NOT NULL DEFAULT 0,
    head_failing_since timestamptz,
    retry_at           timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    delivered_at       timestamptz
);
CREATE INDEX subscriptions_owner ON subscriptions (owner, created_at, id);
CREATE INDEX subscriptions_part ON subscriptions (part);

-- The last offset delivered (or skipped past) per topic, in the topic's epoch. A topic the
-- subscription has not reached yet starts after start_after (0, or the "after" it was
-- created with); topics that existed when it was created start at their end then.
CREATE TABLE subscription_cursors (
    subscription_id text    NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    topic           text    NOT NULL,
    "offset"        bigint  NOT NULL,
    epoch           integer NOT NULL DEFAULT 1,
    PRIMARY KEY (subscription_id, topic)
);

-- Rows given up on after the retry schedule: delivery went on past them.
CREATE TABLE subscription_failures (
    id              bigserial   PRIMARY KEY,
    subscription_id text        NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    topic           text        NOT NULL,
    "offset"        bigint      NOT NULL,
    kind            text        NOT NULL,
    attempts        integer     NOT NULL,
    error           text        NOT NULL,
    first_failed_at timestamptz NOT NULL,
    failed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscription_failures_sub ON subscription_failures (subscription_id, id);
