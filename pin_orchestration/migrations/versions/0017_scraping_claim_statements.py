"""scraping claim in two statements per pick (issue 15): same signature and behaviour as
0016's `scraping.claim_jobs`, cheaper per job.

- The probe finds the class's queue with the smallest head tag, locks it and its domain's
  row (FOR UPDATE OF q, d SKIP LOCKED) and counts the domain's connections in one
  statement, which also writes the previous pick's queue change (data-modifying CTE).
- The head job and the queue's next head tag in one statement.
- A domain, once locked, is kept in the call's local state; its token spends are written
  once, set-based, at the end.

The SQL is frozen in 0017_scraping_claim_statements.sql / .down.sql beside this file; the
live function definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0017
Revises: 0016
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
