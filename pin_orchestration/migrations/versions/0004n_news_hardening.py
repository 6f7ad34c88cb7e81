"""news hardening (issue 8): the window of an interrupted DailyWindow pass is kept with
its checkpoint, so the run that resumes it covers what the cut run owed; retention's
retired totals (what deleted rows contributed to counters and histograms, so a metric
never goes backwards) and the indexes its oldest-first deletes walk.

The SQL is frozen in 0004n_news_hardening.sql / .down.sql beside this file.

Revision ID: 0004n
Revises: 0003
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0004n"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
