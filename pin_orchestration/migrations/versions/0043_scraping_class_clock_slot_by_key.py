"""The claim names the clock slot it raises by its key, not its ctid (revises 0042): a slot
another claim committed after the statement's snapshot was locked in its new version, which
that snapshot does not see, so the UPDATE matched no row and the claim waited for its
fall-back slot (pg_backend_pid() % 8) with other slots free, holding the one it had locked.
Now the slot is locked by a statement of its own and written by its key in the next.

The SQL is frozen in 0043_scraping_class_clock_slot_by_key.sql / .down.sql beside this
file; the live definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0043
Revises: 0042
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
