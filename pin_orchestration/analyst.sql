-- What analysts load as DataFrames (pin_orchestration/analyst.py): asset values read from
-- the tables the jobs keep, never copied.

-- name: reconcile_runs_of_partition
SELECT run_id,
       status,
       started_at,
       finished_at,
       result->>'scope' AS scope,
       coalesce((result->>'posts_reconciled')::bigint, 0) AS posts_reconciled,
       coalesce((result->>'drift_corrected')::bigint, 0) AS drift_corrected,
       coalesce(result->'corrections', '[]'::jsonb) AS corrections
FROM pin.job_runs
WHERE job_code = :job_code AND result->>'partition' = :partition
  AND status IN ('succeeded', 'failed')
ORDER BY finished_at, id

-- name: post_statuses
SELECT id AS post_id, status AS post_status FROM news.posts WHERE id = ANY(:post_ids)

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
