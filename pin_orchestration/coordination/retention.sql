-- Queries of pin-retention: one per kind of row that is deleted once old enough. Each is
-- one statement, so one transaction: the oldest :batch_size deletable rows (SKIP LOCKED:
-- a row a worker holds is left for the next batch), deleted, and what they contributed
-- to a counter or histogram added to pin.retired_totals in the same transaction — the
-- metrics read live rows + retired totals, so a scrape never sees a counter go down.
-- Returns the number of rows deleted.

-- Done detach intents, by when they became Done. Pending and Quarantined rows are never
-- deleted. news_snapshot_detach_lag_seconds keeps their lag.
-- name: snapshot_detach_done
WITH doomed AS (
    SELECT id FROM news.snapshot_detach_outbox
    WHERE status = 'Done' AND updated_at < :cutoff
    ORDER BY updated_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM news.snapshot_detach_outbox AS o
    WHERE o.id IN (SELECT id FROM doomed)
    RETURNING extract(epoch FROM o.updated_at - o.created_at) AS lag_seconds
),
retired AS (
    SELECT 'news_snapshot_detach/lag_le' AS counter, b.bound::text AS label,
           count(*) FILTER (WHERE g.lag_seconds <= b.bound) AS value
    FROM unnest(CAST(:lag_bounds AS double precision[])) AS b (bound)
    CROSS JOIN gone AS g
    GROUP BY b.bound
    UNION ALL
    SELECT 'news_snapshot_detach/lag', 'count', count(*) FROM gone
    UNION ALL
    SELECT 'news_snapshot_detach/lag', 'sum', coalesce(sum(lag_seconds), 0) FROM gone
),
added AS (
    INSERT INTO pin.retired_totals AS t (counter, label, value)
    SELECT counter, label, value FROM retired WHERE value <> 0
    ON CONFLICT (counter, label) DO UPDATE
        SET value = t.value + excluded.value, updated_at = now()
)
SELECT count(*) FROM gone

-- Published chessboard events, by when they were published. Unpublished rows are the
-- publisher's backlog and are never deleted; no metric counts published rows.
-- name: chessboard_published_events
WITH doomed AS (
    SELECT id FROM chessboard.event_outbox
    WHERE published_at IS NOT NULL AND published_at < :cutoff
    ORDER BY published_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM chessboard.event_outbox WHERE id IN (SELECT id FROM doomed) RETURNING id
)
SELECT count(*) FROM gone

-- Job runs, by when they finished. The newest run and the newest succeeded run of each
-- job stay whatever their age (backlog_remaining, "no successful run in 26 h"). What a
-- run added to its job's counters and to the run-duration histogram is retired per job
-- and status: runs, every numeric field of `result`, duration_ms per bucket bound.
-- name: job_runs
WITH kept AS (
    (SELECT DISTINCT ON (job_code) id FROM pin.job_runs ORDER BY job_code, finished_at DESC)
    UNION
    (SELECT DISTINCT ON (job_code) id FROM pin.job_runs WHERE status = 'succeeded'
     ORDER BY job_code, finished_at DESC)
),
doomed AS (
    SELECT id FROM pin.job_runs
    WHERE finished_at < :cutoff AND id NOT IN (SELECT id FROM kept)
    ORDER BY finished_at
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM pin.job_runs AS r WHERE r.id IN (SELECT id FROM doomed)
    RETURNING r.job_code, r.status, r.result
),
retired AS (
    SELECT 'job_runs/' || job_code || '/runs' AS counter, status AS label,
           count(*)::double precision AS value
    FROM gone GROUP BY job_code, status
    UNION ALL
    SELECT 'job_runs/' || g.job_code || '/' || f.key, g.status,
           sum(CAST(f.value AS text)::double precision)
    FROM gone AS g, jsonb_each(g.result) AS f
    WHERE jsonb_typeof(f.value) = 'number'
    GROUP BY g.job_code, f.key, g.status
    UNION ALL
    SELECT 'job_runs/' || g.job_code || '/duration_ms_le', b.bound::text,
           count(*) FILTER (WHERE (g.result ->> 'duration_ms')::double precision <= b.bound)
    FROM gone AS g
    CROSS JOIN unnest(CAST(:duration_bounds AS double precision[])) AS b (bound)
    WHERE g.status <> 'skipped' AND g.result ? 'duration_ms'
    GROUP BY g.job_code, b.bound
),
added AS (
    INSERT INTO pin.retired_totals AS t (counter, label, value)
    SELECT counter, label, value FROM retired WHERE value <> 0
    ON CONFLICT (counter, label) DO UPDATE
        SET value = t.value + excluded.value, updated_at = now()
)
SELECT count(*) FROM gone

-- Stored scraping results, by when their job finished (SCR-10): the jobs' results are
-- marked expired (GET /jobs/{id}/result answers 410) and their keys returned, for the
-- caller to delete from the results store before this transaction commits.
-- name: scraping_results
WITH doomed AS (
    SELECT id FROM scraping.jobs
    WHERE status = 'succeeded' AND result_expired_at IS NULL AND finished_at < :cutoff
    ORDER BY finished_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE scraping.jobs AS j
SET result_expired_at = now()
FROM doomed
WHERE j.id = doomed.id
RETURNING j.result_key

-- The objects a scraping job ended without (issue 16): each attempt stores its body under
-- `…/{job_id}/{attempt}` (store.result_key), and the job keeps one of them as its result;
-- the others — a losing attempt's, one whose worker died between its put and its finish,
-- the attempts of a job that then failed or was cancelled — are deleted once the job has
-- been over for the option's age. The keys are derived, attempts 1..attempts plus the
-- pre-0012 key `…/{job_id}`, so nothing was recorded per put; absent keys delete as no-ops.
-- Every swept job yields at least one key, so a short batch means the backlog is done.
-- name: scraping_attempt_objects
WITH doomed AS (
    SELECT id FROM scraping.jobs
    WHERE attempt_objects_swept_at IS NULL
      AND status IN ('succeeded', 'failed', 'cancelled') AND finished_at < :cutoff
    ORDER BY finished_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), swept AS (
    UPDATE scraping.jobs AS j
    SET attempt_objects_swept_at = now()
    FROM doomed
    WHERE j.id = doomed.id
    RETURNING j.attempts, j.result_key,
              format('results/%s/%s/%s', j.tenant_id,
                     to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY/MM/DD'), j.id) AS prefix
)
SELECT k.key
FROM swept
CROSS JOIN LATERAL (
    SELECT swept.prefix AS key
    UNION ALL
    SELECT swept.prefix || '/' || n FROM generate_series(1, swept.attempts) AS n
) AS k
WHERE k.key IS DISTINCT FROM swept.result_key
