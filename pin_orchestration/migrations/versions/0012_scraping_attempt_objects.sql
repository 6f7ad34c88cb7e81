-- Migration 0012: scraping: one result object per attempt, and the sweep's mark (issue 16).

ALTER TABLE scraping.jobs ADD COLUMN attempt_objects_swept_at timestamptz;

CREATE INDEX ix_jobs_attempt_objects_unswept ON scraping.jobs (finished_at, id)
WHERE attempt_objects_swept_at IS NULL
  AND status IN ('succeeded', 'failed', 'cancelled');
