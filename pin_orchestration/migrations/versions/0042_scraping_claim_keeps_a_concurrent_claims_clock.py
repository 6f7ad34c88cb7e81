"""A claim keeps its class clocks when another claim is writing the class state (revises
0041). A claim that found scraping.pick_classes held by another claim (SKIP LOCKED) wrote
none of it, its start clock too: a tenant parked meanwhile came back at the other claim's
clock, behind the tags this one picked, with turns banked while it had nothing to claim
(issue 30 item 7, tests/scraping/test_fairness_blocked.py). With 4 claimers most claims
find it held. Now, when its start clock is more than a turn ahead of the committed one, it
folds its clocks in, largest wins, after that claim commits (at most half a second); within
a turn it leaves them (a returning tenant gains at most that). The 6:3:1 sequence write is
still the first claim's.

The SQL is frozen in 0042_scraping_claim_keeps_a_concurrent_claims_clock.sql / .down.sql
beside this file; the live definition is pin_orchestration/scraping/sql/claim_jobs.sql.

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
