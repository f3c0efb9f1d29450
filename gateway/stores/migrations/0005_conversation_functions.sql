-- Storing a chat message, and its reply, in one round trip each.
--
-- conversation_receive does in one statement what the service did in about eight (find the
-- active conversation, check for a redelivery, /new, count, insert, feed row, commit), and
-- conversation_reply what it did in five. Called outside a transaction each statement
-- commits on its own, so the caller signals the feed row (gateway/push/feed.py publish)
-- after it returns. Locks are taken in the order the service took them: the conversation
-- row, then the feed topic's counter row.
--
-- Inside the functions every column is qualified and every parameter is p_*, so no name
-- is ever ambiguous between a column and a PL/pgSQL variable.

-- What one message stored or found: the feed fields are NULL for a redelivery (nothing was
-- stored); reply_* describe the stored reply of a redelivered message, if any.
CREATE TYPE conversation_received AS (
    conversation_id bigint,
    created         boolean,  -- this message started the conversation (first contact, /new)
    duplicate       boolean,  -- stored before under this platform message id: nothing stored
    seq             integer,
    reply_seq       integer,
    reply_text      text,
    reply_settled   boolean,
    feed_offset     bigint,
    feed_epoch      integer,
    feed_created_at timestamptz
);

-- One stored message (or the reply that already existed: feed fields NULL).
CREATE TYPE conversation_stored AS (
    seq             integer,
    text            text,
    feed_offset     bigint,
    feed_epoch      integer,
    feed_created_at timestamptz
);

-- The statement of feed.append (_APPEND in gateway/push/feed.py): the topic's counter row
-- stays row-locked until the caller commits, so offsets commit in order. Keep both alike.
CREATE FUNCTION feed_append(p_topic text, p_kind text, p_payload jsonb,
                            OUT feed_offset bigint, OUT feed_epoch integer,
                            OUT feed_created_at timestamptz)
LANGUAGE sql AS $$
    WITH counter AS (
        INSERT INTO feed_topics AS t (topic, last_offset) VALUES (p_topic, 1)
        ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + 1
        RETURNING t.topic, t.last_offset, t.epoch
    )
    INSERT INTO feed AS f (topic, "offset", epoch, kind, payload)
    SELECT counter.topic, counter.last_offset, counter.epoch, p_kind, p_payload FROM counter
    RETURNING f."offset", f.epoch, f.created_at
$$;

-- Append a message as the conversation's next seq, with its feed row on
-- conversation:<id> (kind message; the payload ConversationService published before).
-- The UPDATE row-locks the conversation until the caller's transaction ends.
CREATE FUNCTION conversation_append(
    p_conversation_id bigint, p_role text, p_text text, p_platform_message_id text,
    p_reply_to integer, p_user_id text, p_user_name text,
    p_platform text, p_chat text, p_thread text)
RETURNS conversation_stored
LANGUAGE plpgsql AS $$
DECLARE
    stored conversation_stored;
BEGIN
    UPDATE conversations AS c
       SET message_count = c.message_count + 1, last_message_at = now()
     WHERE c.id = p_conversation_id
    RETURNING c.message_count INTO stored.seq;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'conversation % does not exist', p_conversation_id;
    END IF;
    INSERT INTO conversation_messages (conversation_id, seq, role, platform_message_id,
                                       reply_to, user_id, user_name, text)
    VALUES (p_conversation_id, stored.seq, p_role, p_platform_message_id, p_reply_to,
            p_user_id, p_user_name, p_text);
    stored.text := p_text;
    SELECT a.feed_offset, a.feed_epoch, a.feed_created_at
      INTO stored.feed_offset, stored.feed_epoch, stored.feed_created_at
      FROM feed_append('conversation:' || p_conversation_id, 'message', jsonb_build_object(
               'conversation_id', p_conversation_id, 'seq', stored.seq, 'role', p_role,
               'text', p_text, 'platform', p_platform, 'chat', p_chat, 'thread', p_thread,
               'user_id', p_user_id, 'user_name', p_user_name)) AS a;
    RETURN stored;
END
$$;

-- The chat's active conversation, row-locked: the pointer's (from the cache; NULL or stale
-- is fine) if it is still this chat's active one, else the chat's active one, else a new one.
-- Two first messages of a chat at once: the partial unique index conversations_one_active
-- makes the second INSERT wait for the first to commit and then do nothing; the next lap
-- finds (and locks) the row the first created. resolved_created: this call inserted it.
CREATE FUNCTION conversation_resolve(
    p_platform text, p_chat_key text, p_chat text, p_thread text, p_team text,
    p_pointer bigint, OUT resolved_id bigint, OUT resolved_created boolean)
LANGUAGE plpgsql AS $$
BEGIN
    resolved_created := false;
    IF p_pointer IS NOT NULL THEN
        SELECT c.id INTO resolved_id FROM conversations AS c
         WHERE c.id = p_pointer AND c.active
           AND c.platform = p_platform AND c.chat_key = p_chat_key
           FOR UPDATE;
    END IF;
    WHILE resolved_id IS NULL LOOP
        SELECT c.id INTO resolved_id FROM conversations AS c
         WHERE c.platform = p_platform AND c.chat_key = p_chat_key AND c.active
           FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO conversations AS c (platform, chat_key, chat, thread, team)
        VALUES (p_platform, p_chat_key, p_chat, p_thread, p_team)
        ON CONFLICT (platform, chat_key) WHERE active DO NOTHING
        RETURNING c.id INTO resolved_id;
        resolved_created := FOUND;
    END LOOP;
END
$$;

-- Store one inbound user message, atomically: resolve the active conversation; a platform
-- message id stored before as a user message of it is a redelivery (return that seq and its
-- reply's state, store nothing); else "/new" (p_is_new) on a conversation this call did not
-- just create ends it and starts the next; then append the message and its feed row.
CREATE FUNCTION conversation_receive(
    p_platform text, p_chat_key text, p_chat text, p_thread text, p_team text,
    p_pointer bigint, p_message_id text, p_user_id text, p_user_name text, p_text text,
    p_is_new boolean)
RETURNS conversation_received
LANGUAGE plpgsql AS $$
DECLARE
    got conversation_received;
    stored conversation_stored;
BEGIN
    got.duplicate := false;
    SELECT r.resolved_id, r.resolved_created INTO got.conversation_id, got.created
      FROM conversation_resolve(p_platform, p_chat_key, p_chat, p_thread, p_team,
                                p_pointer) AS r;
    IF NOT got.created THEN
        SELECT m.seq, r.seq, r.text, r.settled_at IS NOT NULL
          INTO got.seq, got.reply_seq, got.reply_text, got.reply_settled
          FROM conversation_messages AS m
          LEFT JOIN conversation_messages AS r
            ON r.conversation_id = m.conversation_id AND r.role = 'bot' AND r.reply_to = m.seq
         WHERE m.conversation_id = got.conversation_id AND m.role = 'user'
           AND m.platform_message_id = p_message_id;
        IF FOUND THEN
            got.duplicate := true;
            RETURN got;
        END IF;
        IF p_is_new THEN
            UPDATE conversations AS c SET active = false, ended_at = now()
             WHERE c.platform = p_platform AND c.chat_key = p_chat_key AND c.active;
            INSERT INTO conversations AS c (platform, chat_key, chat, thread, team)
            VALUES (p_platform, p_chat_key, p_chat, p_thread, p_team)
            RETURNING c.id INTO got.conversation_id;
            got.created := true;
        END IF;
    END IF;
    stored := conversation_append(got.conversation_id, 'user', p_text, p_message_id, NULL,
                                  p_user_id, p_user_name, p_platform, p_chat, p_thread);
    got.seq := stored.seq;
    got.feed_offset := stored.feed_offset;
    got.feed_epoch := stored.feed_epoch;
    got.feed_created_at := stored.feed_created_at;
    RETURN got;
END
$$;

-- Store the bot's reply to message p_reply_to with its feed row. A reply to that message
-- stored before (conversation_messages_reply allows one) is returned instead, feed fields
-- NULL: the conversation row lock makes the check and the insert one step for every caller.
CREATE FUNCTION conversation_reply(
    p_conversation_id bigint, p_reply_to integer, p_text text,
    p_platform text, p_chat text, p_thread text)
RETURNS conversation_stored
LANGUAGE plpgsql AS $$
DECLARE
    stored conversation_stored;
BEGIN
    PERFORM 1 FROM conversations AS c WHERE c.id = p_conversation_id FOR UPDATE;
    SELECT m.seq, m.text INTO stored.seq, stored.text
      FROM conversation_messages AS m
     WHERE m.conversation_id = p_conversation_id AND m.role = 'bot'
       AND m.reply_to = p_reply_to;
    IF FOUND THEN
        RETURN stored;
    END IF;
    RETURN conversation_append(p_conversation_id, 'bot', p_text, NULL, p_reply_to, NULL, NULL,
                               p_platform, p_chat, p_thread);
END
$$;
