-- Completion webhooks (SCR-11): the delivery loop's queries. A finished job with a
-- callback_url owes one acknowledged delivery while finish_published_at is NULL; the
-- retry state (webhook_attempts, webhook_next_attempt_at) lives on the job row, each
-- attempt is a row of scraping.webhook_deliveries.

-- name: webhook_stats
-- One cheap query for the sensor (index ix_jobs_webhook_due).
SELECT count(*) FILTER (WHERE coalesce(webhook_next_attempt_at, finished_at) <= now()) AS due,
       count(*) AS pending
FROM scraping.jobs
WHERE callback_url IS NOT NULL AND finish_published_at IS NULL
  AND status IN ('succeeded', 'failed', 'cancelled')

-- name: claim_webhooks
-- Take up to :limit due deliveries, skipping rows another loop is claiming; each gets its
-- attempt number and a lease (webhook_next_attempt_at pushed past the call's timeout), so
-- a loop killed mid-call leaves the delivery due again once the lease ends. The secret a
-- rotation replaced signs too while the rotation is younger than :secret_overlap_seconds.
WITH picked AS (
    SELECT id
    FROM scraping.jobs
    WHERE callback_url IS NOT NULL AND finish_published_at IS NULL
      AND status IN ('succeeded', 'failed', 'cancelled')
      AND coalesce(webhook_next_attempt_at, finished_at) <= now()
    ORDER BY coalesce(webhook_next_attempt_at, finished_at), id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE scraping.jobs j
SET webhook_attempts = j.webhook_attempts + 1,
    webhook_next_attempt_at = now() + make_interval(secs => :lease_seconds)
FROM picked, scraping.tenants t
WHERE j.id = picked.id AND t.id = j.tenant_id
RETURNING j.id, j.tenant_id, j.callback_url, j.status, j.finished_at, j.webhook_attempts,
          t.webhook_secret,
          CASE WHEN t.webhook_secret_rotated_at > now() - make_interval(secs => :secret_overlap_seconds)
               THEN t.webhook_secret_previous END AS webhook_secret_previous

-- name: record_webhook_attempt
-- The attempt's outcome, written only while the claim is still this attempt's (a job
-- requeued meanwhile owes a new announcement and is left alone): delivered or given up
-- closes the delivery (finish_published_at), a retry sets when it is due again.
WITH job AS (
    UPDATE scraping.jobs
    SET finish_published_at = CASE WHEN :outcome IN ('delivered', 'gave_up') THEN now() END,
        webhook_next_attempt_at = CAST(:next_attempt_at AS timestamptz)
    WHERE id = :job_id AND webhook_attempts = :number AND finish_published_at IS NULL
      AND status = :job_status
    RETURNING id
)
INSERT INTO scraping.webhook_deliveries (
    job_id, number, job_status, url, outcome, http_status, error_class, error_detail,
    duration_ms, next_attempt_at
)
SELECT id, :number, :job_status, :url, :outcome, :http_status, :error_class,
       :error_detail, :duration_ms, CAST(:next_attempt_at AS timestamptz)
FROM job
RETURNING job_id

-- name: list_webhook_deliveries
SELECT number, job_status, attempted_at, url, outcome, http_status, error_class,
       error_detail, duration_ms, next_attempt_at
FROM scraping.webhook_deliveries
WHERE job_id = :job_id
ORDER BY id

-- name: tenant_webhook_secret
SELECT id, name, webhook_secret, webhook_secret_rotated_at, webhook_secret_previous
FROM scraping.tenants
WHERE name = :name

-- name: rotate_tenant_webhook_secret
-- The replaced secret is kept for the overlap (claim_webhooks); a second rotation within
-- it retires the first secret at once.
UPDATE scraping.tenants
SET webhook_secret = :webhook_secret, webhook_secret_previous = webhook_secret,
    webhook_secret_rotated_at = now()
WHERE name = :name
RETURNING id, name, webhook_secret, webhook_secret_rotated_at, webhook_secret_previous
