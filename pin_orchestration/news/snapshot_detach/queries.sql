-- Queries of news-snapshot-detach-retry (seed 001). Every due-time comparison and stamp is
-- on PostgreSQL's clock (now(), the transaction's start): the worker sends durations
-- (leases, backoffs), never times, so a worker whose clock is off claims what is due and
-- parks what failed as the database sees it. A row moves through two short
-- transactions per attempt: the claim (attempts + 1, next_attempt_at = a lease: the call's
-- timeout + the backoff) and the outcome (Done / Pending with last_error and the next
-- attempt a backoff after the call ended / Quarantined). The selections call happens
-- between them with no transaction open. The claim stamp (attempts, next_attempt_at) is
-- the row's version: an outcome or a release applies only while the row still carries
-- the stamp of the claim it belongs to, so it never overwrites a newer claim.

-- The SQL function other services call too (migration 0005): one active row per
-- snapshot, safe against that row turning Done while the enqueue runs.
-- name: enqueue
SELECT news.enqueue_snapshot_detach(
           CAST(:snapshot_id AS uuid), CAST(:post_id AS uuid), CAST(:reason AS text)
       )

-- Oldest due first, in ix_sdo_due's order (status, next_attempt_at) and no further: with
-- a tiebreak outside the index (id) every claim sorted all due rows sharing a due time (a
-- burst enqueued in one transaction shares one: 10,000 rows took ~20 ms a claim); in the
-- index's order the scan stops after :batch_size rows. Rows held by a parallel claimer
-- are skipped, not waited on.
-- Run in the claim's transaction, or alone on a drain's autocommit connection (its row
-- locks then last for this statement only: mark_claimed's stamp condition is what makes
-- the claim exclusive). Committed without waiting for the WAL flush (set_config: no
-- extra round trip): a claim lost to a crash only means one more (idempotent) call.
-- name: lock_due
SELECT id, snapshot_id, post_id, reason, attempts, next_attempt_at,
       set_config('synchronous_commit', 'off', true) AS commit_mode
FROM news.snapshot_detach_outbox
WHERE status = 'Pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT :batch_size
FOR UPDATE SKIP LOCKED

-- The claim stamp: attempts + 1 and the lease (the call's timeout + the backoff, per row)
-- from the database's now(); returned, as the row's version for the outcome. Only a row
-- that still carries what lock_due read is stamped: one a parallel claimer (or an
-- operator) changed in between is left to it, so two claims never share a row even when
-- lock_due's row locks were not held until here.
-- name: mark_claimed
UPDATE news.snapshot_detach_outbox AS o
SET attempts = c.attempts,
    next_attempt_at = now() + make_interval(secs => c.lease_seconds),
    updated_at = now()
FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[]),
            CAST(:lease_seconds AS double precision[]),
            CAST(:previous_next_attempt_ats AS timestamptz[]))
     AS c (id, attempts, lease_seconds, previous_next_attempt_at),
     (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
WHERE o.id = c.id AND o.status = 'Pending'
  AND o.attempts = c.attempts - 1 AND o.next_attempt_at = c.previous_next_attempt_at
RETURNING o.id, o.next_attempt_at

-- A failed call's row gets its next attempt counted from the end of the call: now() plus
-- what is left of the backoff (retry_after); until then the claim's lease kept it from
-- being due.
-- name: record_outcomes
UPDATE news.snapshot_detach_outbox AS o
SET status = c.status, last_error = c.last_error,
    next_attempt_at = coalesce(now() + make_interval(secs => c.retry_after),
                               o.next_attempt_at),
    updated_at = now()
FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[]),
            CAST(:next_attempt_ats AS timestamptz[]), CAST(:statuses AS text[]),
            CAST(:last_errors AS text[]), CAST(:retry_afters AS double precision[]))
     AS c (id, attempts, next_attempt_at, status, last_error, retry_after),
     (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
WHERE o.id = c.id AND o.status = 'Pending'
  AND o.attempts = c.attempts AND o.next_attempt_at = c.next_attempt_at
RETURNING o.id, o.next_attempt_at

-- A claimed row whose call never started (the run was stopped) gets its attempt back.
-- name: release_claims
UPDATE news.snapshot_detach_outbox AS o
SET attempts = c.previous_attempts, next_attempt_at = c.previous_next_attempt_at,
    updated_at = now()
FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[]),
            CAST(:next_attempt_ats AS timestamptz[]), CAST(:previous_attempts AS integer[]),
            CAST(:previous_next_attempt_ats AS timestamptz[]))
     AS c (id, attempts, next_attempt_at, previous_attempts, previous_next_attempt_at)
WHERE o.id = c.id AND o.status = 'Pending'
  AND o.attempts = c.attempts AND o.next_attempt_at = c.next_attempt_at

-- What the sensor reads each tick: cheap on ix_sdo_due (status is its leading column).
-- `now`: the clock the stalled check compares due times and the last success with (both
-- the database's), never the daemon's.
-- name: sensor_state
SELECT now() AS now,
       count(*) FILTER (WHERE status = 'Pending' AND next_attempt_at <= now()) AS due,
       min(next_attempt_at) FILTER (WHERE status = 'Pending') AS oldest_due,
       count(*) FILTER (WHERE status = 'Quarantined') AS quarantined
FROM news.snapshot_detach_outbox
WHERE status IN ('Pending', 'Quarantined')

-- Runbook (DET-7): a quarantined row goes back to Pending with a fresh attempt budget.
-- name: requeue_quarantined
UPDATE news.snapshot_detach_outbox
SET status = 'Pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
    updated_at = now()
WHERE status = 'Quarantined'
  AND (id = CAST(:id AS uuid) OR snapshot_id = CAST(:snapshot_id AS uuid))
RETURNING id, snapshot_id, post_id

-- name: quarantined_entries
SELECT id, snapshot_id, post_id, reason, attempts, last_error, updated_at
FROM news.snapshot_detach_outbox
WHERE status = 'Quarantined'
ORDER BY updated_at DESC
LIMIT :limit

-- The entries `pin demo seed` quarantined on purpose (last_error starts with :prefix)
-- that are still Quarantined.
-- name: demo_quarantined_ids
SELECT id FROM news.snapshot_detach_outbox
WHERE status = 'Quarantined' AND starts_with(last_error, :prefix)
ORDER BY id

-- name: outbox_state
SELECT count(*) FILTER (WHERE status = 'Pending') AS pending,
       count(*) FILTER (WHERE status = 'Quarantined') AS quarantined,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'Pending')), 0)
           AS oldest_age_seconds
FROM news.snapshot_detach_outbox
WHERE status <> 'Done'

-- Lag (created_at → Done) of every Done row, bucketed for the histogram; rows deleted by
-- pin-retention count through pin.retired_totals, so the histogram never goes down.
-- name: done_lag_histogram
SELECT b.upper_bound,
       count(o.id) + coalesce((
           SELECT t.value FROM pin.retired_totals AS t
           WHERE t.counter = 'news_snapshot_detach/lag_le'
             AND t.label = CAST(b.upper_bound AS text)), 0) AS cumulative_count
FROM unnest(CAST(:bounds AS double precision[])) AS b (upper_bound)
LEFT JOIN news.snapshot_detach_outbox AS o
       ON o.status = 'Done'
      AND extract(epoch FROM o.updated_at - o.created_at) <= b.upper_bound
GROUP BY b.upper_bound
ORDER BY b.upper_bound

-- name: done_lag_totals
SELECT count(*) + coalesce((SELECT value FROM pin.retired_totals
                             WHERE counter = 'news_snapshot_detach/lag' AND label = 'count'), 0)
           AS count,
       coalesce(sum(extract(epoch FROM updated_at - created_at)), 0)
           + coalesce((SELECT value FROM pin.retired_totals
                       WHERE counter = 'news_snapshot_detach/lag' AND label = 'sum'), 0)
           AS sum_seconds
FROM news.snapshot_detach_outbox
WHERE status = 'Done'

-- Counter totals over every recorded run of the job (pin.job_runs result), plus what
-- runs deleted by pin-retention contributed.
-- name: run_totals
WITH live AS (
    SELECT coalesce(sum((result ->> 'succeeded')::bigint), 0) AS succeeded,
           coalesce(sum((result ->> 'retried')::bigint), 0) AS retried,
           coalesce(sum((result ->> 'failed')::bigint), 0) AS failed,
           coalesce(sum((result ->> 'quarantined')::bigint), 0) AS quarantined
    FROM pin.job_runs
    WHERE job_code = :job_code
),
retired AS (
    SELECT coalesce(sum(value) FILTER (WHERE name = 'succeeded'), 0) AS succeeded,
           coalesce(sum(value) FILTER (WHERE name = 'retried'), 0) AS retried,
           coalesce(sum(value) FILTER (WHERE name = 'failed'), 0) AS failed,
           coalesce(sum(value) FILTER (WHERE name = 'quarantined'), 0) AS quarantined
    FROM pin.retired_totals,
         LATERAL (SELECT substr(counter, length('job_runs/' || :job_code || '/') + 1)) AS n (name)
    WHERE starts_with(counter, 'job_runs/' || :job_code || '/')
)
SELECT live.succeeded + retired.succeeded AS succeeded,
       live.retried + retired.retried AS retried,
       live.failed + retired.failed AS failed,
       live.quarantined + retired.quarantined AS quarantined
FROM live, retired
