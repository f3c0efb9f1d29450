-- Core: one row per installation, so operators can tell databases apart.
CREATE TABLE gateway_installation (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    installed_at timestamptz NOT NULL DEFAULT now(),
    instance_id uuid NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO gateway_installation DEFAULT VALUES;
