-- The claim before issue 9, kept as the benches' baseline: oldest due first, no
-- priorities, no tenants, no domain limits.

-- name: fifo_claim
WITH picked AS (
    SELECT id
    FROM scraping.jobs
    WHERE status = 'queued' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE scraping.jobs j
    SET status = 'running',
        attempts = j.attempts + 1,
        lease_owner = :worker,
        lease_expires_at = now() + make_interval(secs => :lease_seconds),
        started_at = coalesce(j.started_at, now()),
        updated_at = now()
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.*
), attempt AS (
    INSERT INTO scraping.job_attempts (job_id, number, worker)
    SELECT id, attempts, :worker FROM claimed
)
SELECT id, tenant_id, url, domain, priority, params, attempts,
       attempts - attempts_before_requeue AS budget_used, created_at
FROM claimed
