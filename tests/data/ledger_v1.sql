-- usage ledger, schema version 1 (created by the proxy on first delivery)
CREATE TABLE IF NOT EXISTS usage_records (
    record_id uuid PRIMARY KEY,
    schema_version integer NOT NULL,
    request_id text NOT NULL,
    time timestamptz NOT NULL,
    tenant text NOT NULL,
    key_hash text,
    model text,
    endpoint text NOT NULL,
    operation text NOT NULL,
    upstream_version text,
    prompt_tokens_reported integer,
    prompt_tokens_billed integer,
    completion_tokens_reported integer,
    completion_tokens_billed integer,
    verdict text,
    m integer,
    n integer,
    status integer NOT NULL,
    latency_ms double precision NOT NULL,
    instance text NOT NULL,
    inserted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS usage_records_tenant_time ON usage_records (tenant, time);
