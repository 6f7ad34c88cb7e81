-- Migration 0009 down: back to 0008.

DROP TABLE scraping.webhook_deliveries;
DROP INDEX scraping.ix_jobs_result_age;
DROP INDEX scraping.ix_jobs_webhook_due;

ALTER TABLE scraping.jobs
    DROP COLUMN finish_published_at,
    DROP COLUMN webhook_attempts,
    DROP COLUMN webhook_next_attempt_at,
    DROP COLUMN result_expired_at;

ALTER TABLE scraping.tenants
    DROP COLUMN webhook_secret,
    DROP COLUMN webhook_secret_rotated_at;
