-- Queries of news-comment-reconcile (seed 000). One batch is one statement: pick the next
-- BatchSize candidate posts by id (keyset), lock those not held by a live hot-path
-- writer (SKIP LOCKED), count their Visible comments, assign absolute values only where
-- they differ, and move the checkpoint — all in the batch's single transaction.

-- name: full_sweep_candidates
SELECT p.id
FROM news.posts AS p
WHERE p.id > :cursor AND p.status <> 'Archived'
ORDER BY p.id
LIMIT :batch_size

-- name: daily_window_candidates
SELECT p.id
FROM news.posts AS p
WHERE p.id > :cursor AND p.status <> 'Archived'
  AND p.id IN (
      SELECT c.post_id FROM news.comments AS c WHERE c.updated_at >= :window_start
      UNION
      SELECT c.post_id FROM news.comments AS c WHERE c.created_at >= :window_start
  )
ORDER BY p.id
LIMIT :batch_size

-- A FullSweep batch covers a dense id range: one index range scan counts it.
-- name: visible_in_id_range
c.post_id BETWEEN (SELECT id FROM locked ORDER BY id LIMIT 1)
              AND (SELECT id FROM locked ORDER BY id DESC LIMIT 1)

-- A DailyWindow batch is sparse: probe the index per post instead.
-- name: visible_in_id_list
c.post_id IN (SELECT id FROM locked)

-- name: reconcile_batch
WITH candidates AS MATERIALIZED (
    {candidates}
),
locked AS MATERIALIZED (
    SELECT p.id, p.comments_count
    FROM news.posts AS p
    WHERE p.id IN (SELECT id FROM candidates) AND p.status <> 'Archived'
    ORDER BY p.id
    FOR UPDATE SKIP LOCKED
),
visible AS (
    SELECT c.post_id, count(*) AS visible_count
    FROM news.comments AS c
    WHERE c.status = 'Visible' AND {visible_filter}
    GROUP BY c.post_id
),
drift AS (
    SELECT l.id, l.comments_count AS old_count, coalesce(v.visible_count, 0) AS new_count
    FROM locked AS l
    LEFT JOIN visible AS v ON v.post_id = l.id
    WHERE l.comments_count <> coalesce(v.visible_count, 0)
),
corrected AS (
    UPDATE news.posts AS p
    SET comments_count = d.new_count, updated_at = now()
    FROM drift AS d
    WHERE p.id = d.id
    RETURNING p.id, d.old_count, d.new_count
),
checkpoint AS (
    -- A full batch leaves the cursor at its last candidate; a short one means the sweep
    -- reached the end, so the next run starts from the beginning again.
    INSERT INTO pin.job_checkpoints AS k (checkpoint_key, last_id, updated_at)
    VALUES (
        :checkpoint_key,
        CASE WHEN (SELECT count(*) FROM candidates) = :batch_size
             THEN (SELECT id FROM candidates ORDER BY id DESC LIMIT 1) END,
        now()
    )
    ON CONFLICT (checkpoint_key) DO UPDATE
        SET last_id = excluded.last_id, updated_at = excluded.updated_at
)
SELECT
    (SELECT count(*) FROM candidates) AS candidate_count,
    (SELECT id FROM candidates ORDER BY id DESC LIMIT 1) AS last_candidate_id,
    (SELECT count(*) FROM locked) AS locked_count,
    (SELECT coalesce(
        json_agg(json_build_object('post_id', id, 'from', old_count, 'to', new_count)),
        '[]'::json)
     FROM corrected) AS corrections

-- name: read_checkpoint
SELECT last_id FROM pin.job_checkpoints WHERE checkpoint_key = :checkpoint_key
