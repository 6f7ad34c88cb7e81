-- Queries of news-comment-reconcile (seed 000). A batch is one statement, so one
-- transaction: the next BatchSize candidate posts by id (keyset), their Visible comment
-- counts, and — for those whose counter differs — a row lock on each one (SKIP LOCKED: a
-- post held by a live hot-path inc/dec is skipped, never waited on), the absolute
-- assignment and the checkpoint move.
--
-- Only drifted posts are locked: a clean post needs no write, and locking every post would
-- write every heap page of news.posts. A drifted post whose row changed after the
-- statement's snapshot (xmin differs: a hot-path writer committed meanwhile) is skipped
-- like a locked one, so a count taken before that write never overwrites it; the next run
-- reconciles it.

-- name: full_sweep_candidates
SELECT p.id, p.comments_count, p.xmin AS row_version
FROM news.posts AS p
WHERE p.id > :cursor AND p.status <> 'Archived'
ORDER BY p.id
LIMIT :batch_size

-- name: daily_window_candidates
SELECT p.id, p.comments_count, p.xmin AS row_version
FROM news.posts AS p
WHERE p.id > :cursor AND p.status <> 'Archived'
  AND p.id IN (
      SELECT c.post_id FROM news.comments AS c WHERE c.updated_at >= :window_start
      UNION
      SELECT c.post_id FROM news.comments AS c WHERE c.created_at >= :window_start
  )
ORDER BY p.id
LIMIT :batch_size

-- A FullSweep batch covers a dense id range: one index-only range scan counts it (the
-- comments of archived posts in the range are counted too, and ignored).
-- name: visible_in_id_range
c.post_id > :cursor AND c.post_id <= (SELECT last_candidate_id FROM batch)

-- A DailyWindow batch is sparse: probe the index per candidate instead.
-- name: visible_in_id_list
c.post_id = ANY(ARRAY(SELECT id FROM candidates))

-- name: reconcile_batch
WITH candidates AS MATERIALIZED (
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
    SELECT k.id, k.comments_count AS old_count, coalesce(v.visible_count, 0) AS new_count,
           k.row_version
    FROM candidates AS k
    LEFT JOIN visible AS v ON v.post_id = k.id
    WHERE k.comments_count <> coalesce(v.visible_count, 0)
),
-- Row locks and the update address posts by `id = ANY(ARRAY(...))`: the planner cannot
-- estimate how few drifted posts a batch has, and given a join it may pick a scan of the
-- whole of news.posts; an id array keeps both on primary-key lookups.
locked AS MATERIALIZED (
    SELECT p.id
    FROM news.posts AS p
    JOIN drifted AS d ON d.id = p.id
    WHERE p.id = ANY(ARRAY(SELECT id FROM drifted)) AND p.status <> 'Archived'
      AND p.xmin = d.row_version
    FOR UPDATE OF p SKIP LOCKED
),
corrected AS (
    UPDATE news.posts AS p
    SET comments_count = d.new_count, updated_at = now()
    FROM drifted AS d
    WHERE p.id = ANY(ARRAY(SELECT id FROM locked)) AND p.id = d.id
    RETURNING p.id, d.old_count, d.new_count
),
checkpoint AS (
    -- A full batch leaves the cursor at its last candidate; a short one means the sweep
    -- reached the end, so the next run starts from the beginning again.
    INSERT INTO pin.job_checkpoints AS k (checkpoint_key, last_id, updated_at)
    SELECT :checkpoint_key,
           CASE WHEN candidate_count = :batch_size THEN last_candidate_id END,
           now()
    FROM batch
    ON CONFLICT (checkpoint_key) DO UPDATE
        SET last_id = excluded.last_id, updated_at = excluded.updated_at
)
SELECT
    batch.candidate_count,
    batch.last_candidate_id,
    (SELECT count(*) FROM drifted) AS drifted_count,
    (SELECT coalesce(
        json_agg(json_build_object('post_id', id, 'from', old_count, 'to', new_count)
                 ORDER BY id),
        '[]'::json)
     FROM corrected) AS corrections
FROM batch

-- name: read_checkpoint
SELECT last_id FROM pin.job_checkpoints WHERE checkpoint_key = :checkpoint_key
