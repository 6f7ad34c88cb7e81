"""Foundation: news reference tables and the project's own pin tables.

news.posts / news.comments are owned upstream by the news service; we create them so the
project runs on its own, with every column beyond the ones we read nullable or defaulted
so a writer that knows only those columns can insert.

Revision ID: 0001
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS news")
    op.execute("CREATE SCHEMA IF NOT EXISTS pin")
    op.execute(
        """
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
        )
        """
    )
    op.execute(
        """
        CREATE TABLE news.comments (
            id uuid PRIMARY KEY,
            post_id uuid NOT NULL REFERENCES news.posts (id),
            status text NOT NULL DEFAULT 'Visible'
                CHECK (status IN ('Visible', 'HiddenByModerator', 'DeletedByAuthor')),
            author_id uuid,
            body text,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # The reconcile counts Visible comments per post over a range of post ids: a partial
    # index on post_id serves that as an index-only range scan.
    op.execute(
        "CREATE INDEX ix_comments_post_visible ON news.comments (post_id) WHERE status = 'Visible'"
    )
    # DailyWindow finds posts whose comments were created or changed since the cutoff.
    op.execute("CREATE INDEX ix_comments_updated_at ON news.comments (updated_at)")
    op.execute("CREATE INDEX ix_comments_created_at ON news.comments (created_at)")

    op.execute(
        """
        CREATE TABLE pin.distributed_locks (
            lock_key text PRIMARY KEY,
            holder text NOT NULL,
            acquired_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        )
        """
    )
    op.execute(
        """
        CREATE TABLE pin.job_checkpoints (
            checkpoint_key text PRIMARY KEY,
            last_id uuid,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE pin.job_runs (
            id bigserial PRIMARY KEY,
            job_code text NOT NULL,
            run_id text NOT NULL,
            status text NOT NULL CHECK (status IN ('succeeded', 'failed', 'skipped', 'cancelled')),
            started_at timestamptz NOT NULL,
            finished_at timestamptz NOT NULL DEFAULT now(),
            result jsonb NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    op.execute("CREATE INDEX ix_job_runs_job_finished ON pin.job_runs (job_code, finished_at DESC)")


def downgrade() -> None:
    op.execute("DROP TABLE pin.job_runs")
    op.execute("DROP TABLE pin.job_checkpoints")
    op.execute("DROP TABLE pin.distributed_locks")
    op.execute("DROP TABLE news.comments")
    op.execute("DROP TABLE news.posts")
