-- 0021: the lease index answers lease comparisons only, not "which jobs are running".
DROP INDEX scraping.ix_jobs_lease;
CREATE INDEX ix_jobs_lease ON scraping.jobs (lease_expires_at)
    WHERE status = 'running' AND lease_expires_at IS NOT NULL;
