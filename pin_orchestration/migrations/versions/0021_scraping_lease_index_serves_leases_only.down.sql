-- 0021 down: the lease index of 0006 (every running job).
DROP INDEX scraping.ix_jobs_lease;
CREATE INDEX ix_jobs_lease ON scraping.jobs (lease_expires_at) WHERE status = 'running';
