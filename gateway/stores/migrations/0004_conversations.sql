-- Conversations: one active conversation per chat, its messages, and the replies
-- that could not be delivered (the outbound dead letters).
--
-- chat_key identifies a chat within its platform: "<chat>" for Telegram, "<team>/<channel>/
-- <thread or ->" for Slack, "<channel>/<root or ->" for Mattermost. The partial unique index
-- makes "the active conversation" a fact PostgreSQL enforces, so a lost cache pointer is
-- re-derived from here and never behaves like /new.
CREATE TABLE conversations (
    id              bigserial   PRIMARY KEY,
    platform        text        NOT NULL,
    chat_key        text        NOT NULL,
    chat            text        NOT NULL,
    thread          text,
    team            text,
    active          boolean     NOT NULL DEFAULT true,
    message_count   integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_message_at timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz
);
CREATE UNIQUE INDEX conversations_one_active ON conversations (platform, chat_key) WHERE active;
CREATE INDEX conversations_by_chat ON conversations (platform, chat_key, id);

-- seq numbers the messages of one conversation from 1; user messages are unique per platform
-- message id (a redelivered message is stored once), and a bot reply is unique per message it
-- answers (a retried handling never stores two answers). settled_at marks a bot reply as
-- delivered or dead-lettered; a redelivered message whose reply is unsettled (the process died
-- in between) gets that stored reply sent again rather than a second answer.
CREATE TABLE conversation_messages (
    conversation_id     bigint      NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq                 integer     NOT NULL CHECK (seq > 0),
    role                text        NOT NULL CHECK (role IN ('user', 'bot')),
    platform_message_id text,
    reply_to            integer,
    user_id             text,
    user_name           text,
    text                text        NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    settled_at          timestamptz,
    PRIMARY KEY (conversation_id, seq)
);
CREATE UNIQUE INDEX conversation_messages_inbound
    ON conversation_messages (conversation_id, platform_message_id) WHERE role = 'user';
CREATE UNIQUE INDEX conversation_messages_reply
    ON conversation_messages (conversation_id, reply_to) WHERE role = 'bot';

-- A reply that failed every delivery attempt; kept until an operator resends or drops it.
CREATE TABLE undelivered_replies (
    id              bigserial   PRIMARY KEY,
    platform        text        NOT NULL,
    chat            text        NOT NULL,
    thread          text,
    team            text,
    conversation_id bigint      REFERENCES conversations (id) ON DELETE SET NULL,
    message_seq     integer,
    text            text        NOT NULL,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
