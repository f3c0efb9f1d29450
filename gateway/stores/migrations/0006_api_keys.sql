-- API keys: the key itself is shown once at creation; only its SHA-256 is kept. A revoked key
-- keeps its row (revoked_at) so `gateway apikey list` still shows what it was.
CREATE TABLE api_keys (
    id          text        PRIMARY KEY,
    name        text        NOT NULL,
    key_hash    bytea       NOT NULL,
    scopes      text[]      NOT NULL,
    topics      text[]      NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
