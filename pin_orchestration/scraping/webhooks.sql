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
-- Take up to :limit due deliveries (the loop's free slots: each is sent the moment it is
-- claimed, so its lease — webhook_next_attempt_at pushed past one call's timeout — never
-- runs out while it waits behind others), skipping rows another loop is claiming. Fair
-- between tenants: each tenant's oldest due deliveries up to its free share
-- (:per_tenant minus what this loop has in flight for it), taken in turns across tenants,
-- so one tenant whose receiver hangs holds at most its share of the slots. A loop killed
-- mid-call leaves the delivery due again once the lease ends. The secret a rotation
-- replaced signs too while the rotation is younger than :secret_overlap_seconds.
WITH candidates AS (
    SELECT d.id, d.due_at,
           row_number() OVER (PARTITION BY t.id ORDER BY d.due_at, d.id) AS turn,
           coalesce(busy.in_flight, 0) AS in_flight
    FROM scraping.tenants t
    CROSS JOIN LATERAL (
        SELECT j.id, coalesce(j.webhook_next_attempt_at, j.finished_at) AS due_at
        FROM scraping.jobs j
        WHERE j.tenant_id = t.id
          AND j.callback_url IS NOT NULL AND j.finish_published_at IS NULL
          AND j.status IN ('succeeded', 'failed', 'cancelled')
          AND coalesce(j.webhook_next_attempt_at, j.finished_at) <= now()
        ORDER BY coalesce(j.webhook_next_attempt_at, j.finished_at), j.id
        LIMIT :per_tenant
    ) AS d
    LEFT JOIN unnest(CAST(:busy_tenants AS uuid[]), CAST(:busy_counts AS integer[]))
        AS busy(tenant_id, in_flight) ON busy.tenant_id = t.id
), picked AS (
    SELECT j.id
    FROM scraping.jobs j
    JOIN candidates c ON c.id = j.id
    WHERE c.turn + c.in_flight <= :per_tenant
      -- Read again on the locked row: another loop may have claimed it meanwhile.
      AND j.finish_published_at IS NULL
      AND coalesce(j.webhook_next_attempt_at, j.finished_at) <= now()
    ORDER BY c.turn, c.due_at, j.id
    LIMIT :limit
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE scraping.jobs j
SET webhook_attempts = j.webhook_attempts + 1,
    webhook_next_attempt_at = now() + make_interval(secs => :lease_seconds)
FROM picked, scraping.tenants t
WHERE j.id = picked.id AND t.id = j.tenant_id
RETURNING j.id, j.tenant_id, j.callback_url, j.status, j.finished_at, j.webhook_attempts,
          now() AS db_now,
          t.webhook_secret,
          CASE WHEN t.webhook_secret_rotated_at > now() - make_interval(secs => :secret_overlap_seconds)
               THEN t.webhook_secret_previous END AS webhook_secret_previous

-- name: record_webhook_attempt
-- The attempt's outcome, written only while the claim is still this attempt's and for
-- the finish it announced: a job requeued meanwhile owes a new announcement and is left
-- alone, even once it has finished again with the same status and its new delivery has
-- reached the same attempt number (finished_at, which the webhook carries, tells the two
-- finishes apart). Delivered or given up closes the delivery (finish_published_at), a
-- retry sets when it is due again: :retry_in_seconds from now() on this clock, the one
-- the claim reads (a due time computed on the loop's host would move with its skew).
WITH job AS (
    UPDATE scraping.jobs
    SET finish_published_at = CASE WHEN :outcome IN ('delivered', 'gave_up') THEN now() END,
        webhook_next_attempt_at =
            now() + make_interval(secs => CAST(:retry_in_seconds AS double precision))
    WHERE id = :job_id AND webhook_attempts = :number AND finish_published_at IS NULL
      AND status = :job_status
      AND finished_at IS NOT DISTINCT FROM CAST(:finished_at AS timestamptz)
    RETURNING id, webhook_next_attempt_at
)
INSERT INTO scraping.webhook_deliveries (
    job_id, number, job_status, url, outcome, http_status, error_class, error_detail,
    duration_ms, next_attempt_at
)
SELECT id, :number, :job_status, :url, :outcome, :http_status, :error_class,
       :error_detail, :duration_ms, webhook_next_attempt_at
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
