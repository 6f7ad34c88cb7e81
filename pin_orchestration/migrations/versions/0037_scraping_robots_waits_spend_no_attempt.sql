-- 0037: attempts that only waited on robots.txt (handed back robots_pending or
-- robots_unreachable, nothing sent to the job's URL) are not spent from its budget: the
-- claim, the sweeper and the worker count attempts - attempts_before_requeue - robots_waits.
-- A requeue resets it with the budget.
ALTER TABLE scraping.jobs
    ADD COLUMN robots_waits integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_robots_waits_check CHECK (robots_waits >= 0);
