-- What an issuer may mint and what it minted (issue 24): an API key names the accounts it may
-- mint tokens for (`subs` patterns; none for the keys before this); a refresh family names the
-- credentials it was minted through (`issued_by`: key:<id>, sub:<sub>, jti:<jti>, fam:<family>),
-- so revoking one ends the families, and where its account's chat links grant (`link_topics`,
-- NULL = anywhere: the issuer could read them all).
ALTER TABLE api_keys ADD COLUMN subs text[] NOT NULL DEFAULT '{}';
ALTER TABLE refresh_tokens ADD COLUMN issued_by text[] NOT NULL DEFAULT '{}';
ALTER TABLE refresh_tokens ADD COLUMN link_topics text[];
CREATE INDEX refresh_tokens_issued_by ON refresh_tokens USING gin (issued_by);
