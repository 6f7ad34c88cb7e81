-- Migration 0009: scraping completion webhooks (SCR-11) and expiry of stored results (SCR-10).

ALTER TABLE scraping.tenants
    ADD COLUMN webhook_secret text NOT NULL DEFAULT
        'whsec_' || replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
    ADD COLUMN webhook_secret_rotated_at timestamptz NOT NULL DEFAULT now();

ALTER TABLE scraping.jobs
    ADD COLUMN finish_published_at timestamptz,
    ADD COLUMN webhook_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN webhook_next_attempt_at timestamptz,
    ADD COLUMN result_expired_at timestamptz;

-- Jobs finished before webhooks existed are not announced now.
UPDATE scraping.jobs SET finish_published_at = finished_at
WHERE callback_url IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled');

-- The delivery sensor's and loop's query: owed webhooks, due first.
CREATE INDEX ix_jobs_webhook_due ON scraping.jobs
    ((coalesce(webhook_next_attempt_at, finished_at)), id)
WHERE callback_url IS NOT NULL AND finish_published_at IS NULL
  AND status IN ('succeeded', 'failed', 'cancelled');

-- Retention of results: stored results not yet expired, oldest first.
CREATE INDEX ix_jobs_result_age ON scraping.jobs (finished_at, id)
WHERE status = 'succeeded' AND result_expired_at IS NULL;

CREATE TABLE scraping.webhook_deliveries (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES scraping.jobs (id) ON DELETE CASCADE,
    -- The attempt's number for this finish (a requeued job announces its next
    -- finish from 1 again) and the status it announced.
    number integer NOT NULL,
    job_status text NOT NULL,
    attempted_at timestamptz NOT NULL DEFAULT now(),
    url text NOT NULL,
    -- delivered: a 2xx; retry: will be sent again; gave_up: the last attempt
    -- (cap reached, or the address is refused).
    outcome text NOT NULL CHECK (outcome IN ('delivered', 'retry', 'gave_up')),
    http_status integer,
    error_class text,
    error_detail text CHECK (length(error_detail) <= 512),
    duration_ms integer NOT NULL,
    next_attempt_at timestamptz
);

CREATE INDEX ix_webhook_deliveries_job ON scraping.webhook_deliveries (job_id, id);
