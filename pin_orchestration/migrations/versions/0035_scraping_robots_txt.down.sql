-- 0035 down: no robots.txt state; scraping.domains.rps is the operator's limit again.
DROP TRIGGER domains_effective_rps ON scraping.domains;
DROP FUNCTION scraping.domains_effective_rps();
DROP TRIGGER domains_pause_cause ON scraping.domains;
DROP FUNCTION scraping.domains_pause_cause();
UPDATE scraping.domains SET rps = configured_rps;
ALTER TABLE scraping.domains
    DROP COLUMN configured_rps,
    DROP COLUMN crawl_delay,
    DROP COLUMN robots_default_rps,
    DROP COLUMN robots_mode,
    DROP COLUMN robots_reason,
    DROP COLUMN robots_set_by,
    DROP COLUMN robots_set_at,
    DROP COLUMN pause_cause;
DROP TABLE scraping.robots;
ALTER TABLE scraping.jobs DROP COLUMN timeout_seconds;
