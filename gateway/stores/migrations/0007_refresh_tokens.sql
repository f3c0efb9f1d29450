-- Refresh tokens, hashes only. A login starts a family; every refresh spends its token
-- (used_at) and adds the next one to the family. A spent token presented again after the
-- grace window means it was stolen: the whole family is revoked.
CREATE TABLE refresh_tokens (
    token_hash  bytea       PRIMARY KEY,
    family      text        NOT NULL,
    sub         text        NOT NULL,
    scopes      text[]      NOT NULL,
    topics      text[]      NOT NULL,
    access_ttl  integer     NOT NULL,
    issued_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    revoked_at  timestamptz
);
CREATE INDEX refresh_tokens_family ON refresh_tokens (family);
CREATE INDEX refresh_tokens_sub ON refresh_tokens (sub);
