-- Queue alerts read straight from the queue tables, so any process can evaluate them.

-- name: chessboard_due_backlog
SELECT count(*) AS due, min(due_at) AS oldest_due
FROM chessboard.project_recalc_requests
WHERE due_at <= now()

-- name: scraping_due_backlog
SELECT count(*) AS due, min(next_attempt_at) AS oldest_due
FROM scraping.jobs
WHERE status = 'queued' AND next_attempt_at <= now()

-- name: scraping_jobs_past_lease
SELECT count(*) AS past_lease, min(lease_expires_at) AS oldest_expiry
FROM scraping.jobs
WHERE status = 'running' AND lease_expires_at < now()
