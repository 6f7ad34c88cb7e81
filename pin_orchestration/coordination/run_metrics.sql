-- Figures of one job's runs (pin.job_runs, by job_code) for the Prometheus collectors.
-- Counters and histograms add what runs deleted by pin-retention had contributed
-- (pin.retired_totals, per job and status), so they never go down.

-- name: job_run_totals
WITH live AS (
    SELECT
        count(*) FILTER (WHERE status = 'failed') AS errors,
        coalesce(sum((result->>'duration_ms')::bigint)
                 FILTER (WHERE status <> 'skipped'), 0) AS duration_sum,
        count(*) FILTER (WHERE status <> 'skipped') AS runs
    FROM pin.job_runs WHERE job_code = :job_code
),
retired AS (
    SELECT
        coalesce(sum(value) FILTER (WHERE name = 'runs' AND label = 'failed'), 0) AS errors,
        coalesce(sum(value) FILTER (WHERE name = 'duration_ms' AND label <> 'skipped'), 0)
            AS duration_sum,
        coalesce(sum(value) FILTER (WHERE name = 'runs' AND label <> 'skipped'), 0) AS runs
    FROM pin.retired_totals,
         LATERAL (SELECT substr(counter, length('job_runs/' || :job_code || '/') + 1))
             AS n (name)
    WHERE starts_with(counter, 'job_runs/' || :job_code || '/')
)
SELECT live.errors + retired.errors AS errors,
       live.duration_sum + retired.duration_sum AS duration_sum,
       live.runs + retired.runs AS runs
FROM live, retired

-- The cumulative run-duration buckets (ms) of one job.
-- name: run_duration_buckets
SELECT b.le,
       count(r.id) + coalesce((
           SELECT t.value FROM pin.retired_totals AS t
           WHERE t.counter = 'job_runs/' || :job_code || '/duration_ms_le'
             AND t.label = CAST(CAST(b.le AS double precision) AS text)), 0) AS runs
FROM unnest(CAST(:buckets AS bigint[])) AS b(le)
LEFT JOIN pin.job_runs AS r
    ON r.job_code = :job_code AND r.status <> 'skipped'
   AND (r.result->>'duration_ms')::bigint <= b.le
GROUP BY b.le ORDER BY b.le
