-- Chat links: an account (a token's sub) that may read a chat's conversations. A link code
-- (8 digits, 10 minutes, one use) is kept as a hash only; the chat proves itself by sending it.
CREATE TABLE link_codes (
    code_hash   bytea       PRIMARY KEY,
    sub         text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);

CREATE TABLE chat_links (
    id          bigserial   PRIMARY KEY,
    sub         text        NOT NULL,
    platform    text        NOT NULL,
    chat_key    text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (sub, platform, chat_key)
);
CREATE INDEX chat_links_chat ON chat_links (platform, chat_key);
