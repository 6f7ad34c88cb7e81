-- What analysts load as DataFrames (pin_orchestration/analyst.py): asset values read from
-- the tables the jobs keep, never copied.

-- The reconcile's runs of a day, from the record each run keeps for good (not
-- pin.job_runs, which pin-retention empties): every status, since a cancelled or failed
-- run's committed batches changed counters too.
-- name: reconcile_runs_of_partition
SELECT id AS run_ref,
       run_id,
       status,
       started_at,
       finished_at,
       scope,
       posts_reconciled,
       drift_corrected,
       corrections,
       by_status_recorded
FROM news.comment_reconcile_runs
WHERE partition = :partition
ORDER BY started_at, id

-- Every correction of the given runs, by the corrected post's status.
-- name: reconcile_corrections_by_post_status
SELECT t.post_status,
       CAST(sum(t.posts_corrected) AS bigint) AS posts_corrected,
       CAST(sum(t.comments_count_change) AS bigint) AS comments_count_change
FROM news.comment_reconcile_run_totals AS t
JOIN news.comment_reconcile_runs AS r ON r.id = t.run_ref
WHERE r.partition = :partition AND r.run_id = ANY(:run_ids)
GROUP BY t.post_status
ORDER BY t.post_status

-- name: reconcile_runs_without_status_totals
SELECT run_id FROM news.comment_reconcile_runs
WHERE partition = :partition AND run_id = ANY(:run_ids) AND NOT by_status_recorded
ORDER BY run_id

-- name: project_aggregates_of_project
SELECT 'project' AS level, id, name, property_objects_total_count AS total_count,
       property_objects_free_count AS free_count, price_min, price_max,
       NULL::integer AS layouts_count, NULL::numeric AS area_min, NULL::numeric AS area_max,
       version, updated_at
FROM chessboard.projects WHERE id = :project_id
UNION ALL
SELECT 'building', id, name, property_objects_total_count, property_objects_free_count,
       NULL, NULL, NULL, NULL, NULL, version, updated_at
FROM chessboard.buildings WHERE project_id = :project_id AND deleted_at IS NULL
UNION ALL
SELECT 'layout_group', id, name, NULL, NULL, NULL, NULL, layouts_count, area_min, area_max,
       version, updated_at
FROM chessboard.layout_groups WHERE project_id = :project_id AND deleted_at IS NULL
UNION ALL
SELECT 'layout', id, name, property_objects_count, NULL, NULL, NULL, NULL, total_area,
       total_area, version, updated_at
FROM chessboard.layouts WHERE project_id = :project_id AND deleted_at IS NULL
ORDER BY 1, 3, 2

-- name: scraping_jobs_of_day
SELECT j.id AS job_id, t.name AS tenant, j.url, j.status, j.attempts,
       j.created_at, j.started_at, j.finished_at,
       extract(epoch FROM j.finished_at - j.created_at) AS seconds_to_finish,
       j.result_key, j.result_size, j.result_sha256
FROM scraping.jobs AS j
JOIN scraping.tenants AS t ON t.id = j.tenant_id
WHERE j.created_at >= CAST(:day AS date) AT TIME ZONE 'UTC'
  AND j.created_at < (CAST(:day AS date) + 1) AT TIME ZONE 'UTC'
ORDER BY j.created_at, j.id
