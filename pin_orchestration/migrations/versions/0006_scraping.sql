-- Migration 0006: the scraping schema (issue 7, SPEC §4, seed 004): tenants, jobs, attempts.

CREATE SCHEMA IF NOT EXISTS scraping;

CREATE TABLE scraping.tenants (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
    -- sha256 of the API key: the key itself is shown once and never stored.
    api_key_sha256 bytea NOT NULL UNIQUE,
    api_key_prefix text NOT NULL,
    key_rotated_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scraping.jobs (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES scraping.tenants (id),
    url text NOT NULL CHECK (length(url) <= 2048),
    params jsonb NOT NULL DEFAULT '{}'::jsonb,
    priority text NOT NULL DEFAULT 'normal'
        CHECK (priority IN ('high', 'normal', 'low')),
    callback_url text CHECK (length(callback_url) <= 2048),
    idempotency_key text CHECK (length(idempotency_key) <= 255),
    -- sha256 of the canonical request body: a repeated key with another body is 422.
    request_sha256 text,
    status text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    -- Attempts ever started (numbers the attempt rows); the retry cap counts those
    -- since the last runbook requeue.
    attempts integer NOT NULL DEFAULT 0,
    attempts_before_requeue integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_owner text,
    lease_expires_at timestamptz,
    cancel_requested_at timestamptz,
    last_error text CHECK (length(last_error) <= 512),
    last_error_class text,
    result_key text,
    result_size bigint,
    result_sha256 text,
    result_content_type text,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'running') = (lease_expires_at IS NOT NULL)),
    CHECK (status <> 'succeeded' OR result_key IS NOT NULL)
);

-- Claim: due queued jobs, oldest due first.
CREATE INDEX ix_jobs_due ON scraping.jobs (next_attempt_at, id)
    WHERE status = 'queued';

-- Sweeper: running jobs whose lease has expired.
CREATE INDEX ix_jobs_lease ON scraping.jobs (lease_expires_at)
    WHERE status = 'running';

-- GET /jobs (keyset by id, newest first), with and without a status filter.
CREATE INDEX ix_jobs_tenant ON scraping.jobs (tenant_id, id);

CREATE INDEX ix_jobs_tenant_status ON scraping.jobs (tenant_id, status, id);

-- Idempotency-Key is per tenant.
CREATE UNIQUE INDEX ux_jobs_idempotency ON scraping.jobs (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE scraping.job_attempts (
    job_id uuid NOT NULL REFERENCES scraping.jobs (id) ON DELETE CASCADE,
    number integer NOT NULL,
    worker text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    -- NULL while in flight; 'lost' when the sweeper found its lease expired.
    outcome text CHECK (outcome IN ('succeeded', 'retry', 'failed', 'lost', 'cancelled')),
    http_status integer,
    error_class text,
    error_detail text CHECK (length(error_detail) <= 512),
    duration_ms integer,
    PRIMARY KEY (job_id, number)
);
