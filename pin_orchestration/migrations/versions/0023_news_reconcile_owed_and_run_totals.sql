-- 0023: what the reconcile owes, and each run's totals, durably.

-- One row per reconcile run (its id drawn at start); its counts grow with each batch, in
-- the batch's transaction. status 'running' until the run records its end; a run that
-- died is marked 'failed' by the next run (which holds the lock, so none other runs).
-- Kept for good (a row or two a day): the value of a materialized day is read from here.
CREATE TABLE news.comment_reconcile_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id text NOT NULL,
    partition text,
    scope text NOT NULL,
    status text NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'succeeded', 'skipped', 'cancelled', 'failed',
                          'retired')),
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    posts_reconciled bigint NOT NULL DEFAULT 0,
    drift_corrected bigint NOT NULL DEFAULT 0,
    posts_skipped bigint NOT NULL DEFAULT 0,
    -- The first corrections the run made ({post_id, from, to}), for people to look at.
    corrections jsonb NOT NULL DEFAULT '[]',
    -- false: recorded before 0023, so its corrections by post status are unknown.
    by_status_recorded boolean NOT NULL DEFAULT true
);
CREATE INDEX ix_comment_reconcile_runs_partition ON news.comment_reconcile_runs (partition);

-- Every correction of a run, summed by the corrected post's status.
CREATE TABLE news.comment_reconcile_run_totals (
    run_ref bigint NOT NULL REFERENCES news.comment_reconcile_runs (id) ON DELETE CASCADE,
    post_status text NOT NULL,
    posts_corrected bigint NOT NULL,
    comments_count_change bigint NOT NULL,
    PRIMARY KEY (run_ref, post_status)
);

-- Posts owed a reconcile: 'skipped' (drifted, but a hot-path writer held or changed the
-- row during the batch), 'lock_held' (activity in the window of a run skipped on the
-- held lock). Every run drains them first; a row goes when a batch has looked at the post
-- with its row in hand. No foreign key: its KEY SHARE lock would make the batch wait on
-- a hot-path writer holding the post FOR UPDATE.
CREATE TABLE news.comment_reconcile_owed (
    post_id uuid PRIMARY KEY,
    reason text NOT NULL CHECK (reason IN ('skipped', 'lock_held')),
    owed_since timestamptz NOT NULL DEFAULT now(),
    run_id text
);

-- The runs recorded so far, with the totals their pin.job_runs rows hold.
INSERT INTO news.comment_reconcile_runs
    (run_id, partition, scope, status, started_at, finished_at, posts_reconciled,
     drift_corrected, corrections, by_status_recorded)
SELECT run_id, result->>'partition', coalesce(result->>'scope', 'unknown'), status,
       started_at, finished_at,
       coalesce((result->>'posts_reconciled')::bigint, 0),
       coalesce((result->>'drift_corrected')::bigint, 0),
       coalesce(result->'corrections', '[]'::jsonb), false
FROM pin.job_runs
WHERE job_code = 'news-comment-reconcile'
ORDER BY finished_at, id;

-- What runs pin-retention deleted had added to the counters: one 'retired' row keeps the
-- Prometheus totals (now read from this table) from going down.
INSERT INTO news.comment_reconcile_runs
    (run_id, scope, status, finished_at, posts_reconciled, drift_corrected,
     by_status_recorded)
SELECT 'retired-before-0023', 'unknown', 'retired', now(),
       coalesce(sum(value) FILTER (
           WHERE counter = 'job_runs/news-comment-reconcile/posts_reconciled'), 0)::bigint,
       coalesce(sum(value) FILTER (
           WHERE counter = 'job_runs/news-comment-reconcile/drift_corrected'), 0)::bigint,
       false
FROM pin.retired_totals
WHERE counter IN ('job_runs/news-comment-reconcile/posts_reconciled',
                  'job_runs/news-comment-reconcile/drift_corrected')
HAVING count(*) > 0;
