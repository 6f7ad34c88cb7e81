-- 0023 down: the reconcile's owed posts and durable run totals go; pin.job_runs still
-- holds what it held.
DROP TABLE news.comment_reconcile_owed;
DROP TABLE news.comment_reconcile_run_totals;
DROP TABLE news.comment_reconcile_runs;
