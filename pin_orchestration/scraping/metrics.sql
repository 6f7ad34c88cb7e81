-- The scraping service's metrics (SCR-12, seed step 31), read at scrape time so any
-- process (`pin metrics serve`, the API's /metrics) serves the same figures.

-- name: queue_depth
-- Every tenant × priority, zeros included, so a drained queue reads 0 instead of vanishing.
SELECT t.name AS tenant, p.priority, count(j.id) AS jobs
FROM scraping.tenants t
CROSS JOIN (VALUES ('high'), ('normal'), ('low')) AS p (priority)
LEFT JOIN scraping.jobs j
    ON j.tenant_id = t.id AND j.priority = p.priority AND j.status = 'queued'
GROUP BY t.name, p.priority
ORDER BY t.name, p.priority

-- name: oldest_due_age
-- How long the job that has waited longest since it fell due has been waiting (a job in
-- its retry backoff is not waiting for us). Uses ix_jobs_due.
SELECT coalesce(EXTRACT(EPOCH FROM now() - min(next_attempt_at)), 0) AS seconds
FROM scraping.jobs
WHERE status = 'queued' AND next_attempt_at <= now()

-- name: running_past_lease
-- Jobs still `running` whose lease ran out: a worker died and the sweeper has not run yet.
SELECT count(*) AS jobs
FROM scraping.jobs
WHERE status = 'running' AND lease_expires_at < now()

-- name: time_to_first_attempt_p95
-- Over jobs accepted since :since_id (a UUIDv7 bound: a primary-key range, no scan):
-- accept → first attempt; a job still waiting counts with its wait so far, so a stalled
-- pool shows instead of hiding. Jobs that ended without an attempt (cancelled) are left out.
SELECT percentile_cont(0.95) WITHIN GROUP (
           ORDER BY EXTRACT(EPOCH FROM coalesce(started_at, now()) - created_at)
       ) AS p95,
       count(*) AS jobs
FROM scraping.jobs
WHERE id >= :since_id AND (started_at IS NOT NULL OR status = 'queued')

-- name: recent_attempt_failures
-- Attempts that ended in the window (cancelled ones aside), by error class and target
-- host, as the metrics' help says: an attempt swept as lost long after it started counts
-- when it ended. failed = it did not fetch (retry, failed, lost). Uses
-- ix_job_attempts_finished. The host comes from
-- the URL as urlsplit reads it: after the scheme and any userinfo, up to port/path.
WITH recent AS (
    SELECT a.outcome IN ('retry', 'failed', 'lost') AS failed,
           coalesce(a.error_class, 'unknown') AS error_class,
           lower(substring(j.url FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?(\[[^]/?#]*\]|[^:/?#]*)'))
               AS domain
    FROM scraping.job_attempts a
    JOIN scraping.jobs j ON j.id = a.job_id
    WHERE a.finished_at >= now() - make_interval(secs => :window_seconds)
      AND a.outcome IS NOT NULL AND a.outcome <> 'cancelled'
)
SELECT domain, error_class, failed, count(*) AS attempts
FROM recent
GROUP BY domain, error_class, failed
