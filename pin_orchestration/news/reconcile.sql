-- Queries of news-comment-reconcile (seed 000). A batch is one transaction of two
-- statements:
--   1. find_drift_and_lock: the next BatchSize candidate posts by id (keyset), their
--      Visible comment counts, and — of those whose counter differs — a row lock on each
--      one not held by a live hot-path writer (SKIP LOCKED: skipped, never waited on).
--   2. correct_locked_posts: recount the locked posts in a fresh snapshot taken after the
--      locks (so a hot-path inc/dec that committed meanwhile is seen, and one still in
--      flight waits for us and applies on top), assign the absolute value where it differs,
--      and move the checkpoint.
-- Only drifted posts are locked: a clean post needs no write, and locking every post
-- would write every heap page of news.posts.

-- name: full_sweep_candidates
SELECT p.id, p.comments_count
FROM news.posts AS p
WHERE p.id > :cursor AND p.status <> 'Archived'
ORDER BY p.id
LIMIT :batch_size

-- name: daily_window_candidates
SELECT p.id, p.comments_count
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
c.post_id BETWEEN (SELECT id FROM candidates ORDER BY id LIMIT 1)
              AND (SELECT id FROM candidates ORDER BY id DESC LIMIT 1)

-- A DailyWindow batch is sparse: probe the index per post instead.
-- name: visible_in_id_list
c.post_id IN (SELECT id FROM candidates)

-- name: find_drift_and_lock
WITH candidates AS MATERIALIZED (
    {candidates}
),
visible AS (
    SELECT c.post_id, count(*) AS visible_count
    FROM news.comments AS c
    WHERE c.status = 'Visible' AND {visible_filter}
    GROUP BY c.post_id
),
drifted AS (
    SELECT k.id
    FROM candidates AS k
    LEFT JOIN visible AS v ON v.post_id = k.id
    WHERE k.comments_count <> coalesce(v.visible_count, 0)
),
locked AS (
    SELECT p.id
    FROM news.posts AS p
    WHERE p.id IN (SELECT id FROM drifted) AND p.status <> 'Archived'
    ORDER BY p.id
    FOR UPDATE SKIP LOCKED
)
SELECT
    (SELECT count(*) FROM candidates) AS candidate_count,
    (SELECT id FROM candidates ORDER BY id DESC LIMIT 1) AS last_candidate_id,
    (SELECT count(*) FROM drifted) AS drifted_count,
    (SELECT coalesce(array_agg(id), '{{}}') FROM locked) AS locked_ids

-- name: correct_locked_posts
WITH locked AS (
    SELECT p.id, p.comments_count AS old_count
    FROM news.posts AS p
    WHERE p.id = ANY(CAST(:locked_ids AS uuid[]))
),
visible AS (
    SELECT c.post_id, count(*) AS visible_count
    FROM news.comments AS c
    WHERE c.status = 'Visible' AND c.post_id = ANY(CAST(:locked_ids AS uuid[]))
    GROUP BY c.post_id
),
corrected AS (
    UPDATE news.posts AS p
    SET comments_count = coalesce(v.visible_count, 0), updated_at = now()
    FROM locked AS l
    LEFT JOIN visible AS v ON v.post_id = l.id
    WHERE p.id = l.id AND l.old_count <> coalesce(v.visible_count, 0)
    RETURNING p.id, l.old_count, p.comments_count AS new_count
),
checkpoint AS (
    -- NULL once the sweep reached the end: the next run starts from the beginning.
    INSERT INTO pin.job_checkpoints AS k (checkpoint_key, last_id, updated_at)
    VALUES (:checkpoint_key, :next_cursor, now())
    ON CONFLICT (checkpoint_key) DO UPDATE
        SET last_id = excluded.last_id, updated_at = excluded.updated_at
)
SELECT coalesce(
    json_agg(json_build_object('post_id', id, 'from', old_count, 'to', new_count) ORDER BY id),
    '[]'::json) AS corrections
FROM corrected

-- name: read_checkpoint
SELECT last_id FROM pin.job_checkpoints WHERE checkpoint_key = :checkpoint_key
