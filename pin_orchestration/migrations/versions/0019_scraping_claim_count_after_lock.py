"""scraping claim: the probe counts connections only for the queue it locked (issue 15), so
concurrent claimers no longer make each other's probes dearer. Same signature and
behaviour as 0017's `scraping.claim_jobs`.

The SQL is frozen in 0019_scraping_claim_count_after_lock.sql / .down.sql beside this
file; the live function definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0019
Revises: 0018
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
