-- Model provider usage: one row per call (DESIGN 8, "AI budgets: SQL aggregate, not a
-- counter"). Budgets are sums over today's rows; each index below covers one budget's sum
-- (tokens included), so the check is an index-only range scan over today's rows.
CREATE TABLE provider_usage (
    id          bigserial   PRIMARY KEY,
    provider    text        NOT NULL,
    model       text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('embeddings', 'chat')),
    tokens_in   integer     NOT NULL CHECK (tokens_in >= 0),
    tokens_out  integer     NOT NULL CHECK (tokens_out >= 0),
    estimated   boolean     NOT NULL DEFAULT false,
    chat_key    text,
    job_id      text,
    account     text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX provider_usage_day ON provider_usage (created_at) INCLUDE (tokens_in, tokens_out);
CREATE INDEX provider_usage_chat ON provider_usage (chat_key, created_at)
    INCLUDE (tokens_in, tokens_out) WHERE chat_key IS NOT NULL;
CREATE INDEX provider_usage_account ON provider_usage (account, created_at)
    INCLUDE (tokens_in, tokens_out) WHERE account IS NOT NULL;
