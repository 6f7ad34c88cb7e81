"""The class clocks (start_clock, tenant_clock) in eight clock slots, so that every claim
raises them without waiting (revises 0041): a claim wrote them only when it could lock the
three scraping.pick_classes rows at once, so with concurrent claimers most claims left the
clocks behind their picks, and a tenant parked meanwhile came back at the old clock with
turns banked. The clocks only grow: each claim raises them with greatest() in a slot no
other claim holds (scraping.pick_class_clocks), and readers take the largest over the
slots (view scraping.class_clocks).

The SQL is frozen in 0042_scraping_class_clocks_in_slots.sql / .down.sql beside this file;
the live definitions are pin_orchestration/scraping/sql/{domain_queues,claim_jobs}.sql.

Revision ID: 0042
Revises: 0041
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
