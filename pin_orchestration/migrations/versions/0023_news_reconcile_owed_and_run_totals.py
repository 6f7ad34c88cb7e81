"""news-comment-reconcile keeps what it owes and what it did (issue 29): the posts a run
skipped (row locked or changed during its batch, or its whole day skipped on a held lock)
stay owed in news.comment_reconcile_owed until a run corrects them, whatever that run's
window; every run's totals — posts reconciled, corrected, skipped, and the corrections by
post status with their change — are kept in news.comment_reconcile_runs and
news.comment_reconcile_run_totals, written by each batch in its own transaction, so a
cancelled, failed or crashed run's committed work counts, and pin-retention (which
deletes pin.job_runs rows) never empties a day the analysts read. The runs pin.job_runs
already holds are copied in, marked as having no totals by post status.

The SQL is frozen in 0023_news_reconcile_owed_and_run_totals.sql / .down.sql beside this
file.

Revision ID: 0023
Revises: 0022
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
