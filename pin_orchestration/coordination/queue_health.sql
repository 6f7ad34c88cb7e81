-- Alerts read straight from the queue tables, so any process can evaluate them.

-- name: scraping_due_backlog
SELECT count(*) AS due, min(next_attempt_at) AS oldest_due
FROM scraping.jobs
WHERE status = 'queued' AND next_attempt_at <= now()

-- name: scraping_jobs_past_lease
SELECT count(*) AS past_lease, min(lease_expires_at) AS oldest_expiry
FROM scraping.jobs
WHERE status = 'running' AND lease_expires_at < now()

-- SLO "95 % of jobs start within a minute", over the jobs accepted in the window that have
-- had their minute. A job cancelled before it ever started is left out; one still waiting
-- counts as late. `id >= :lowest_id` walks the primary key (UUIDv7: creation order)
-- instead of the whole table.
-- name: scraping_start_slo
SELECT count(*) AS jobs,
       count(*) FILTER (
           WHERE started_at <= created_at + make_interval(secs => :start_within_seconds)
       ) AS met
FROM scraping.jobs
WHERE id >= :lowest_id
  AND created_at >= now() - make_interval(secs => :window_seconds)
  AND created_at <= now() - make_interval(secs => :start_within_seconds)
  AND NOT (status = 'cancelled' AND started_at IS NULL)

-- SLO "99 % reach a terminal state without a human", over the jobs accepted in the window
-- that are older than settle_seconds (time enough to finish with every retry). A job a
-- human requeued (attempts_before_requeue > 0) or still not terminal misses it.
-- name: scraping_terminal_slo
SELECT count(*) AS jobs,
       count(*) FILTER (
           WHERE status IN ('succeeded', 'failed', 'cancelled') AND attempts_before_requeue = 0
       ) AS met
FROM scraping.jobs
WHERE id >= :lowest_id
  AND created_at >= now() - make_interval(secs => :window_seconds)
  AND created_at <= now() - make_interval(secs => :settle_seconds)

-- Detach calls that failed (5xx, timeout, network, rejected) in runs finished in the window.
-- name: detach_failed_calls_since
SELECT coalesce(sum((result ->> 'failed')::bigint), 0) AS failed_calls, count(*) AS runs
FROM pin.job_runs
WHERE job_code = :job_code AND finished_at >= now() - make_interval(secs => :window_seconds)
