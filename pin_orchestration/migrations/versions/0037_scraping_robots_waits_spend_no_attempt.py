"""A job handed back because its host's robots.txt was not known (robots_pending) or did not
answer (robots_unreachable) sent nothing to its URL: scraping.jobs.robots_waits counts
those hand-backs, and a job's attempt budget is its attempts since the last requeue less
them (issue 31: waiting on robots.txt is no attempt of the job).

The SQL is frozen in 0037_scraping_robots_waits_spend_no_attempt.sql / .down.sql beside
this file.

Revision ID: 0037
Revises: 0035
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0037"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
