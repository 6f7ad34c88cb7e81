"""scraping.pause_domain: a session's PIN_SCRAPING_MAX_PAUSE_SECONDS caps the pause that
session asks for, never a longer pause already in force. 0026 still clamped an existing pause
to the writing session's cap, so a worker or `pin scraping domain pause` running with a
smaller cap cut another's 50-minute pause to 10 minutes (issue 30: a pause never shortens
except by resume).

The SQL is frozen in 0034_scraping_a_smaller_pause_cap_never_shortens_a_pause.sql /
.down.sql beside this file.

Revision ID: 0034
Revises: 0033
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
