-- Queries of news-comment-reconcile (seed 000).
--
-- The sweep runs server-side: a procedure (created per session in pg_temp from the
-- template below, one per scope) loops over keyset batches and COMMITs after each, so a
-- batch is still one statement and one transaction, and the client's round trip is paid
-- once per slice of batches instead of once per batch. A batch is the next BatchSize
-- candidate posts by id, their Visible comment counts, and — for those whose counter
-- differs — a row lock on each one (SKIP LOCKED: a post held by a live hot-path inc/dec is
-- skipped, never waited on), the absolute assignment and the checkpoint move.
--
-- The row lock is FOR NO KEY UPDATE, the lock the UPDATE itself takes: it does not conflict
-- with the FOR KEY SHARE lock a comment insert's foreign-key check takes on its post, so
-- users' comments never wait for a batch (FOR UPDATE would make them wait).
--
-- Only drifted posts are locked: a clean post needs no write, and locking every post would
-- write every heap page of news.posts. A drifted post whose row changed after the
-- statement's snapshot (xmin differs: a hot-path writer committed meanwhile) is skipped
-- like a locked one, so a count taken before that write never overwrites it; the next run
-- reconciles it.
--
-- Each batch takes the run's lock as a fence in its own statement (the row of
-- pin.distributed_locks with the run's token, unexpired, FOR KEY SHARE): the posts are
-- locked and the checkpoint moves only while the run still holds its lock, and no takeover
-- commits while a batch is in flight (a renewal does not wait for it: locks.py). A batch that finds the lock expired or taken over
-- changes nothing and ends the call (io_lock_lost) — the server-side loop of a run whose
-- client was killed or cut off stops there too.
--
-- Fragments below use the procedure's parameters (p_*) and variables (io_*); the only
-- composition is of these fragments into the template (sql text, never values).

-- name: full_sweep_candidates
SELECT p.id, p.comments_count, p.xmin AS row_version
FROM news.posts AS p
WHERE p.id > io_cursor AND p.id <= p_upper AND p.status <> 'Archived'
ORDER BY p.id
LIMIT p_batch_size

-- The window is bounded on both sides: a backfill of a past day looks at that day's
-- activity only, not at everything since.
-- name: daily_window_candidates
SELECT p.id, p.comments_count, p.xmin AS row_version
FROM news.posts AS p
WHERE p.id > io_cursor AND p.id <= p_upper AND p.status <> 'Archived'
  AND p.id IN (
      SELECT c.post_id FROM news.comments AS c
      WHERE c.updated_at >= p_window_start AND c.updated_at < p_window_end
      UNION
      SELECT c.post_id FROM news.comments AS c
      WHERE c.created_at >= p_window_start AND c.created_at < p_window_end
  )
ORDER BY p.id
LIMIT p_batch_size

-- The posts owed a reconcile (news.comment_reconcile_owed), drained by every run first.
-- name: owed_candidates
SELECT p.id, p.comments_count, p.xmin AS row_version
FROM news.posts AS p
WHERE p.id > io_cursor AND p.id <= p_upper AND p.status <> 'Archived'
  AND p.id IN (SELECT o.post_id FROM news.comment_reconcile_owed AS o
               WHERE o.post_id > io_cursor AND o.post_id <= p_upper)
ORDER BY p.id
LIMIT p_batch_size

-- A FullSweep batch covers a dense id range: one index-only range scan counts it (the
-- comments of archived posts in the range are counted too, and ignored).
-- name: visible_in_id_range
c.post_id > io_cursor AND c.post_id <= (SELECT last_candidate_id FROM batch)

-- A DailyWindow batch is sparse: probe the index per candidate instead.
-- name: visible_in_id_list
c.post_id = ANY(ARRAY(SELECT id FROM candidates))

-- One call reconciles batches after io_cursor up to p_upper (inclusive) until the range
-- is exhausted (io_reached_end) or p_slice_seconds have passed (at least one batch). At
-- the end of the range the checkpoint becomes p_end_cursor: NULL when the pass is
-- complete, the first id when a resumed DailyWindow pass wraps around (no checkpoint at
-- all for the owed leg: p_checkpoint_key NULL). A failing batch is rolled back alone and
-- reported in io_error; the batches before it stay committed.
--
-- Nothing a batch skips is lost: a drifted post it could not lock (or whose row changed
-- since its snapshot) is added to news.comment_reconcile_owed, and every post it looked
-- at with its row in hand leaves it. The run's totals (news.comment_reconcile_runs, row
-- p_run_ref) and its corrections by post status (news.comment_reconcile_run_totals) grow
-- in the same transaction: what a batch committed is counted, however the run ends.
-- name: sweep_procedure
CREATE OR REPLACE PROCEDURE pg_temp.{procedure}(
    p_checkpoint_key text,
    p_batch_size integer,
    p_window_start timestamptz,
    p_window_end timestamptz,
    p_upper uuid,
    p_end_cursor uuid,
    p_slice_seconds double precision,
    p_corrections_kept integer,
    p_lock_key text,
    p_lock_token uuid,
    p_run_ref bigint,
    p_run_id text,
    INOUT io_cursor uuid,
    INOUT io_last_id uuid DEFAULT NULL,
    INOUT io_batches integer DEFAULT 0,
    INOUT io_candidates bigint DEFAULT 0,
    INOUT io_drifted bigint DEFAULT 0,
    INOUT io_corrected bigint DEFAULT 0,
    INOUT io_corrections jsonb DEFAULT '[]',
    INOUT io_reached_end boolean DEFAULT false,
    INOUT io_lock_lost boolean DEFAULT false,
    INOUT io_error text DEFAULT NULL
)
LANGUAGE plpgsql AS $procedure$
DECLARE
    v_until timestamptz := clock_timestamp() + make_interval(secs => p_slice_seconds);
    r record;
BEGIN
    LOOP
        BEGIN
            WITH fence AS MATERIALIZED (
                SELECT 1 FROM pin.distributed_locks
                WHERE lock_key = p_lock_key AND token = p_lock_token
                  AND expires_at > clock_timestamp()
                FOR KEY SHARE
            ),
            candidates AS MATERIALIZED (
                {candidates}
            ),
            batch AS MATERIALIZED (
                SELECT count(*) AS candidate_count,
                       (SELECT id FROM candidates ORDER BY id DESC LIMIT 1) AS last_candidate_id
                FROM candidates
            ),
            visible AS (
                SELECT c.post_id, count(*) AS visible_count
                FROM news.comments AS c
                WHERE c.status = 'Visible' AND {visible_filter}
                GROUP BY c.post_id
            ),
            drifted AS MATERIALIZED (
                SELECT k.id, k.comments_count AS old_count,
                       coalesce(v.visible_count, 0) AS new_count, k.row_version
                FROM candidates AS k
                LEFT JOIN visible AS v ON v.post_id = k.id
                WHERE k.comments_count <> coalesce(v.visible_count, 0)
            ),
            -- Row locks and the update address posts by `id = ANY(ARRAY(...))`: the
            -- planner cannot estimate how few drifted posts a batch has, and given a join
            -- it may pick a scan of the whole of news.posts; an id array keeps both on
            -- primary-key lookups.
            locked AS MATERIALIZED (
                SELECT p.id
                FROM news.posts AS p
                JOIN drifted AS d ON d.id = p.id
                WHERE p.id = ANY(ARRAY(SELECT id FROM drifted)) AND p.status <> 'Archived'
                  AND p.xmin = d.row_version AND EXISTS (SELECT FROM fence)
                FOR NO KEY UPDATE OF p SKIP LOCKED
            ),
            corrected AS (
                UPDATE news.posts AS p
                SET comments_count = d.new_count, updated_at = now()
                FROM drifted AS d
                WHERE p.id = ANY(ARRAY(SELECT id FROM locked)) AND p.id = d.id
                RETURNING p.id, p.status AS post_status, d.old_count, d.new_count
            ),
            -- Drifted, not locked: a hot-path writer holds or changed the row.
            skipped AS MATERIALIZED (
                SELECT d.id FROM drifted AS d
                WHERE d.id <> ALL(ARRAY(SELECT id FROM locked))
            ),
            owed_added AS (
                INSERT INTO news.comment_reconcile_owed AS owed (post_id, reason, run_id)
                SELECT id, 'skipped', p_run_id FROM skipped WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (post_id) DO NOTHING
            ),
            owed_paid AS (
                DELETE FROM news.comment_reconcile_owed AS owed
                WHERE owed.post_id = ANY(ARRAY(SELECT id FROM candidates))
                  AND owed.post_id <> ALL(ARRAY(SELECT id FROM skipped))
                  AND EXISTS (SELECT FROM fence)
            ),
            run_totals AS (
                UPDATE news.comment_reconcile_runs AS run
                SET posts_reconciled = run.posts_reconciled
                        + (SELECT candidate_count FROM batch) - (SELECT count(*) FROM skipped),
                    drift_corrected = run.drift_corrected + (SELECT count(*) FROM corrected),
                    posts_skipped = run.posts_skipped + (SELECT count(*) FROM skipped)
                WHERE run.id = p_run_ref AND EXISTS (SELECT FROM fence)
            ),
            status_totals AS (
                INSERT INTO news.comment_reconcile_run_totals AS total
                    (run_ref, post_status, posts_corrected, comments_count_change)
                SELECT p_run_ref, c.post_status, count(*), sum(c.new_count - c.old_count)
                FROM corrected AS c
                GROUP BY c.post_status
                ON CONFLICT (run_ref, post_status) DO UPDATE
                    SET posts_corrected = total.posts_corrected + excluded.posts_corrected,
                        comments_count_change =
                            total.comments_count_change + excluded.comments_count_change
            ),
            next_checkpoint AS (
                -- A full batch leaves the cursor at its last candidate; a short one means
                -- the range is exhausted.
                SELECT CASE WHEN candidate_count = p_batch_size THEN last_candidate_id
                            ELSE p_end_cursor END AS last_id
                FROM batch
            ),
            checkpoint AS (
                INSERT INTO pin.job_checkpoints AS k
                    (checkpoint_key, last_id, window_start, window_end, updated_at)
                SELECT p_checkpoint_key, last_id,
                       CASE WHEN last_id IS NOT NULL THEN p_window_start END,
                       CASE WHEN last_id IS NOT NULL THEN p_window_end END,
                       now()
                FROM next_checkpoint
                WHERE EXISTS (SELECT FROM fence) AND p_checkpoint_key IS NOT NULL
                ON CONFLICT (checkpoint_key) DO UPDATE
                    SET last_id = excluded.last_id, window_start = excluded.window_start,
                        window_end = excluded.window_end, updated_at = excluded.updated_at
            )
            SELECT
                EXISTS (SELECT FROM fence) AS fenced,
                batch.candidate_count,
                batch.last_candidate_id,
                (SELECT count(*) FROM drifted) AS drifted_count,
                (SELECT coalesce(
                    jsonb_agg(jsonb_build_object('post_id', id, 'from', old_count,
                                                 'to', new_count) ORDER BY id),
                    '[]'::jsonb)
                 FROM corrected) AS corrections
            INTO r
            FROM batch;
        EXCEPTION WHEN OTHERS THEN
            io_error := SQLERRM;
            RETURN;
        END;
        COMMIT;
        IF NOT r.fenced THEN
            io_lock_lost := true;
            RETURN;
        END IF;
        IF r.candidate_count = 0 THEN
            io_reached_end := true;
            RETURN;
        END IF;
        io_batches := io_batches + 1;
        io_candidates := io_candidates + r.candidate_count;
        io_drifted := io_drifted + r.drifted_count;
        io_corrected := io_corrected + jsonb_array_length(r.corrections);
        io_last_id := r.last_candidate_id;
        IF jsonb_array_length(io_corrections) < p_corrections_kept THEN
            io_corrections := io_corrections || (
                SELECT coalesce(jsonb_agg(e), '[]'::jsonb)
                FROM (SELECT e FROM jsonb_array_elements(r.corrections) AS e
                      LIMIT p_corrections_kept - jsonb_array_length(io_corrections)) AS kept
            );
        END IF;
        IF r.candidate_count < p_batch_size THEN
            io_reached_end := true;
            RETURN;
        END IF;
        io_cursor := r.last_candidate_id;
        EXIT WHEN clock_timestamp() >= v_until;
    END LOOP;
END
$procedure$

-- name: call_sweep_procedure
CALL pg_temp.{procedure}(
    CAST(:checkpoint_key AS text), CAST(:batch_size AS integer),
    CAST(:window_start AS timestamptz), CAST(:window_end AS timestamptz),
    CAST(:upper AS uuid), CAST(:end_cursor AS uuid),
    CAST(:slice_seconds AS double precision), CAST(:corrections_kept AS integer),
    CAST(:lock_key AS text), CAST(:lock_token AS uuid), CAST(:run_ref AS bigint),
    CAST(:run_id AS text), CAST(:cursor AS uuid)
)

-- name: read_checkpoint
SELECT last_id, window_start, window_end
FROM pin.job_checkpoints WHERE checkpoint_key = :checkpoint_key

-- A pass begins: its checkpoint at the first post (with its window) before any batch, so
-- a run that dies before its first batch commits still leaves the pass owed. Fenced: only
-- while the run holds its lock. An unfinished pass (a row with a cursor) is left as is.
-- name: begin_pass
INSERT INTO pin.job_checkpoints AS k
    (checkpoint_key, last_id, window_start, window_end, updated_at)
SELECT :checkpoint_key, CAST(:start_cursor AS uuid), :window_start, :window_end, now()
WHERE EXISTS (
    SELECT 1 FROM pin.distributed_locks
    WHERE lock_key = :lock_key AND token = :lock_token AND expires_at > clock_timestamp()
    FOR KEY SHARE
)
ON CONFLICT (checkpoint_key) DO UPDATE
    SET last_id = excluded.last_id, window_start = excluded.window_start,
        window_end = excluded.window_end, updated_at = excluded.updated_at
    WHERE k.last_id IS NULL

-- A FullSweep skipped on the held lock owes a whole pass from the first post, begun after
-- its skip (a pass left pending further on would not reach the posts before its cursor
-- again). It holds no lock, so it writes no checkpoint a lock holder writes: a FullSweep
-- in flight would overwrite it with its next batch and end it with its last, though it
-- passed its first posts before the skip. It leaves a mark of its own instead
-- (:owed_key), which only the next FullSweep that holds the lock takes.
-- name: owe_full_sweep
INSERT INTO pin.job_checkpoints AS k (checkpoint_key, last_id, updated_at)
VALUES (:owed_key, CAST(:start_cursor AS uuid), now())
ON CONFLICT (checkpoint_key) DO UPDATE
    SET last_id = excluded.last_id, updated_at = excluded.updated_at

-- A FullSweep with the lock takes the owed pass, before it reads its checkpoint: its pass
-- (re)starts from the first post. Fenced: only while the run holds its lock.
-- name: take_owed_full_sweep
WITH taken AS (
    DELETE FROM pin.job_checkpoints
    WHERE checkpoint_key = :owed_key
      AND EXISTS (
          SELECT 1 FROM pin.distributed_locks
          WHERE lock_key = :lock_key AND token = :lock_token
            AND expires_at > clock_timestamp()
          FOR KEY SHARE
      )
    RETURNING 1
)
INSERT INTO pin.job_checkpoints AS k (checkpoint_key, last_id, updated_at)
SELECT :checkpoint_key, CAST(:start_cursor AS uuid), now()
FROM taken
ON CONFLICT (checkpoint_key) DO UPDATE
    SET last_id = excluded.last_id, window_start = NULL, window_end = NULL,
        updated_at = excluded.updated_at

-- A DailyWindow skipped on the held lock owes its window: the posts with comment activity
-- in it become owed, for the next run to reconcile whatever its own window.
-- name: owe_window
INSERT INTO news.comment_reconcile_owed AS o (post_id, reason, run_id)
SELECT p.id, 'lock_held', :run_id
FROM news.posts AS p
WHERE p.status <> 'Archived'
  AND p.id IN (
      SELECT c.post_id FROM news.comments AS c
      WHERE c.updated_at >= :window_start AND c.updated_at < :window_end
      UNION
      SELECT c.post_id FROM news.comments AS c
      WHERE c.created_at >= :window_start AND c.created_at < :window_end
  )
ON CONFLICT (post_id) DO NOTHING

-- Owed posts that were archived or deleted since are owed nothing.
-- name: forgive_gone_posts
DELETE FROM news.comment_reconcile_owed AS o
WHERE NOT EXISTS (
    SELECT 1 FROM news.posts AS p WHERE p.id = o.post_id AND p.status <> 'Archived'
)

-- A run's own record, drawn when it starts (under the lock); runs recorded as running
-- before it died with their process: no other run holds the lock.
-- name: end_dead_runs
UPDATE news.comment_reconcile_runs
SET status = 'failed', finished_at = now()
WHERE status = 'running'

-- name: begin_run
INSERT INTO news.comment_reconcile_runs (run_id, partition, scope, status, started_at)
VALUES (:run_id, :partition, :scope, :status, :started_at)
RETURNING id

-- name: end_run
UPDATE news.comment_reconcile_runs
SET status = :status, finished_at = now(), corrections = CAST(:corrections AS jsonb)
WHERE id = :run_ref

-- What is owed: posts, and passes cut, crashed or not yet done (a checkpoint with a
-- cursor), of either scope, or owed by a skipped FullSweep (its mark). A post archived or
-- deleted since it became owed is owed nothing (the next run forgives it,
-- forgive_gone_posts): it is not counted meanwhile.
-- name: backlog
SELECT (SELECT count(*) FROM news.comment_reconcile_owed AS o
        WHERE EXISTS (SELECT 1 FROM news.posts AS p
                      WHERE p.id = o.post_id AND p.status <> 'Archived')) AS owed_posts,
       ARRAY(SELECT checkpoint_key FROM pin.job_checkpoints
             WHERE checkpoint_key = ANY(:checkpoint_keys) AND last_id IS NOT NULL
             ORDER BY checkpoint_key) AS pending_passes

-- Posts reconciled and drift corrected, from each run's record (news.comment_reconcile_runs):
-- each batch adds to it as it commits, so a cancelled, failed or crashed run's work counts,
-- the same totals the analysts read; pin-retention never deletes it (news/metrics.py).
-- name: reconcile_work
SELECT coalesce(sum(posts_reconciled), 0) AS posts_reconciled,
       coalesce(sum(drift_corrected), 0) AS drift_corrected
FROM news.comment_reconcile_runs
