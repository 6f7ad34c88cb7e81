"""scraping intake and requeue: a job announced to its domain queue while a claim holds
that queue waits for the claim (KEY SHARE lock), so a claim that empties and deletes the
queue cannot lose it (issue 15). Same signature as 0018's `scraping.announce_queued_jobs`.

The SQL is frozen in 0020_scraping_announce_waits_for_claim.sql / .down.sql beside this
file; the live function definition is pin_orchestration/scraping/sql/domain_queues.sql.

Revision ID: 0020
Revises: 0019
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
