-- Migration 0008 down: back to 0007.

DROP INDEX scraping.ix_job_attempts_started;
DROP TRIGGER jobs_notify_finished ON scraping.jobs;
DROP FUNCTION scraping.notify_job_finished();
