-- Migration 0001: the news reference tables and the project's own pin tables.

CREATE SCHEMA IF NOT EXISTS news;
CREATE SCHEMA IF NOT EXISTS pin;

CREATE TABLE news.posts (
    id uuid PRIMARY KEY,
    status text NOT NULL DEFAULT 'Draft'
        CHECK (status IN ('Draft', 'Published', 'Unpublished', 'Archived')),
    comments_count integer NOT NULL DEFAULT 0,
    title text,
    author_id uuid,
    comments_enabled boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE news.comments (
    id uuid PRIMARY KEY,
    post_id uuid NOT NULL REFERENCES news.posts (id),
    status text NOT NULL DEFAULT 'Visible'
        CHECK (status IN ('Visible', 'HiddenByModerator', 'DeletedByAuthor')),
    author_id uuid,
    body text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The reconcile counts Visible comments per post over a range of post ids: a partial
-- index on post_id serves that as an index-only range scan.
CREATE INDEX ix_comments_post_visible ON news.comments (post_id) WHERE status = 'Visible';

-- DailyWindow finds posts whose comments were created or changed since the cutoff.
CREATE INDEX ix_comments_updated_at ON news.comments (updated_at);

CREATE INDEX ix_comments_created_at ON news.comments (created_at);

CREATE TABLE pin.distributed_locks (
    lock_key text PRIMARY KEY,
    holder text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

CREATE TABLE pin.job_checkpoints (
    checkpoint_key text PRIMARY KEY,
    last_id uuid,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pin.job_runs (
    id bigserial PRIMARY KEY,
    job_code text NOT NULL,
    run_id text NOT NULL,
    status text NOT NULL CHECK (status IN ('succeeded', 'failed', 'skipped', 'cancelled')),
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    result jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX ix_job_runs_job_finished ON pin.job_runs (job_code, finished_at DESC);
