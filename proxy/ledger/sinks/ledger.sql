-- The usage ledger, schema version 4: what the proxy runs on first delivery (this file is
-- read by proxy/ledger/sinks/postgres.py), for teams that migrate schemas themselves.
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
    trace_id text,
    traceparent text,
    inserted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS usage_records_tenant_time ON usage_records (tenant, time);
CREATE INDEX IF NOT EXISTS usage_records_trace_id ON usage_records (trace_id);
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

-- migrate: schema version 1 to 2
-- Migrating a schema-version-1 table (the proxy does this by itself, in one transaction,
-- when it finds the v1 column request_id; run it yourself if the proxy's role may not
-- ALTER the table). v1 record ids were uuid5(client X-Request-Id) and stay as they are;
-- v2 ids are UUIDv7 minted by the proxy. The type changes rewrite the table once.
BEGIN;
ALTER TABLE usage_records RENAME COLUMN request_id TO client_request_id;
ALTER TABLE usage_records ALTER COLUMN client_request_id DROP NOT NULL;
ALTER TABLE usage_records
    ALTER COLUMN prompt_tokens_reported TYPE bigint,
    ALTER COLUMN prompt_tokens_billed TYPE bigint,
    ALTER COLUMN completion_tokens_reported TYPE bigint,
    ALTER COLUMN completion_tokens_billed TYPE bigint,
    ALTER COLUMN m TYPE bigint,
    ALTER COLUMN n TYPE bigint,
    ADD COLUMN IF NOT EXISTS aborted boolean NOT NULL DEFAULT false;
COMMIT;

-- migrate: schema version 2 to 3
-- Adding the units column (the proxy does this by itself, in one transaction, when the
-- table has no units column). Version 2 rows get their billed tokens as units, the only
-- units version 2 knew, so a query over units sums old and new rows alike. New units are
-- new keys of this jsonb column: no further migration.
BEGIN;
ALTER TABLE usage_records ADD COLUMN units jsonb;
UPDATE usage_records SET units = jsonb_strip_nulls(jsonb_build_object(
    'prompt_tokens', prompt_tokens_billed, 'completion_tokens', completion_tokens_billed));
COMMIT;

-- migrate: schema version 3 to 4
-- Adding the W3C trace of each record (the proxy does this by itself, in one transaction,
-- when the table has no trace_id column). Rows written before it keep a null trace: the
-- proxy did not send one upstream then. Adding nullable columns rewrites no row.
BEGIN;
ALTER TABLE usage_records ADD COLUMN trace_id text, ADD COLUMN traceparent text;
COMMIT;
