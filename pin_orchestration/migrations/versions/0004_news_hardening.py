"""news hardening (issue 8): the window of an interrupted DailyWindow pass is kept with
its checkpoint, so the run that resumes it covers what the cut run owed; retention's
retired totals (what deleted rows contributed to counters and histograms, so a metric
never goes backwards) and the indexes its oldest-first deletes walk.

Revision ID: 0004n
Revises: 0003
"""

from alembic import op

revision = "0004n"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE pin.job_checkpoints
            ADD COLUMN window_start timestamptz,
            ADD COLUMN window_end timestamptz
        """
    )
    op.execute(
        """
        CREATE TABLE pin.retired_totals (
            counter text NOT NULL,
            label text NOT NULL DEFAULT '',
            value double precision NOT NULL DEFAULT 0,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (counter, label)
        )
        """
    )
    op.execute(
        "CREATE INDEX ix_sdo_done_updated ON news.snapshot_detach_outbox (updated_at) "
        "WHERE status = 'Done'"
    )
    op.execute(
        "CREATE INDEX ix_event_outbox_published ON chessboard.event_outbox (published_at) "
        "WHERE published_at IS NOT NULL"
    )
    op.execute("CREATE INDEX ix_job_runs_finished ON pin.job_runs (finished_at)")


def downgrade() -> None:
    op.execute("DROP INDEX pin.ix_job_runs_finished")
    op.execute("DROP INDEX chessboard.ix_event_outbox_published")
    op.execute("DROP INDEX news.ix_sdo_done_updated")
    op.execute("DROP TABLE pin.retired_totals")
    op.execute("ALTER TABLE pin.job_checkpoints DROP COLUMN window_start, DROP COLUMN window_end")
