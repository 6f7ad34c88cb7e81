-- Migration 0012 down: back to 0011.

DROP INDEX scraping.ix_jobs_attempt_objects_unswept;
ALTER TABLE scraping.jobs DROP COLUMN attempt_objects_swept_at;
