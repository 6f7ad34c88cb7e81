-- Migration 0001 down: back to base (the schemas news and pin, and alembic's table, stay).

DROP TABLE pin.job_runs;
DROP TABLE pin.job_checkpoints;
DROP TABLE pin.distributed_locks;
DROP TABLE news.comments;
DROP TABLE news.posts;
