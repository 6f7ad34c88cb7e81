"""scraping redirect hops against their own host (issue 15): a job redirected to another
host takes a request token and a connection of THAT host (`scraping.take_redirect_slot`,
held in `scraping.redirect_slots` until the hop's fetch ends), and the claim counts those
connections with the domain's running jobs.

The SQL is frozen in 0016_scraping_redirect_slots.sql / .down.sql beside this file; the
live function definitions are pin_orchestration/scraping/sql/*.sql.

Revision ID: 0016
Revises: 0015
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
