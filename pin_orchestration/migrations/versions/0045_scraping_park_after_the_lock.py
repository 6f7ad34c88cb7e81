"""A tenant is parked only on what it has when its row is locked (revises 0044): a claim's
set-aside of a domain without room, and a pause, checked "no flow ready" in the snapshot of
the statement that then SKIP-LOCKed the tenant's row, so intake of a claimable job of that
tenant committed in between (it holds a ready tenant's row FOR SHARE only: no new row
version, nothing checked again) left it parked with a flow ready, its jobs stranded until a
set-aside flow woke. Now the rows are locked by one statement and parked by the next.

The SQL is frozen in 0045_scraping_park_after_the_lock.sql / .down.sql beside this file;
the live definitions are pin_orchestration/scraping/sql/claim_jobs.sql and
domain_queues.sql.

Revision ID: 0045
Revises: 0044
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
