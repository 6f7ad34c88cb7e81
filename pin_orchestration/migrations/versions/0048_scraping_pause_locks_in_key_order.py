"""A pause locks its host's queue rows and flows in key order before the host's row, and the
trigger that sets them aside or wakes them fires only on a change (revises 0047): a pause
took them in its trigger's scan order with the host's row held and deadlocked with a batch
intake or the sweeper on one host's rows; a robots.txt refresh that left the rate as it was
woke the flows waiting for the host's next token.

The SQL is frozen in 0048_scraping_pause_locks_in_key_order.sql / .down.sql beside this
file; the live definition of scraping.pause_domain is
pin_orchestration/scraping/sql/pause_domain.sql (the trigger lives only in migrations).

Revision ID: 0048
Revises: 0047
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
