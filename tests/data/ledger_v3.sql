-- usage ledger, schema version 3 (as the proxy created it before traces)
CREATE TABLE IF NOT EXISTS usage_records (
    record_id uuid PRIMARY KEY,
    schema_version integer NOT NULL,
    client_request_id text,
    time timestamptz NOT NULL,
    tenant text NOT NULL,
    key_hash text,
    model text,
    endpoint text NOT NULL,
    operation text NOT NULL,
    upstream_version text,
    prompt_tokens_reported bigint,
    prompt_tokens_billed bigint,
    completion_tokens_reported bigint,
    completion_tokens_billed bigint,
    verdict text,
    m bigint,
    n bigint,
    status integer NOT NULL,
    aborted boolean NOT NULL DEFAULT false,
    latency_ms double precision NOT NULL,
    instance text NOT NULL,
    units jsonb,
    inserted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS usage_records_tenant_time ON usage_records (tenant, time);
CREATE TABLE IF NOT EXISTS reconciliation_windows (
    window_id uuid PRIMARY KEY,
    instance text NOT NULL,
    upstream text NOT NULL,
    start_time timestamptz NOT NULL,
    end_time timestamptz NOT NULL,
    status text NOT NULL,
    body jsonb NOT NULL,
    inserted_at timestamptz NOT NULL DEFAULT now()
);

