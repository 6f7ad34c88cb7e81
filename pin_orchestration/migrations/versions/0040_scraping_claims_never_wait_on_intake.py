"""A claim is not held up by a tenant whose row intake holds (revises 0039): intake holds
its tenant's row until it commits, and a producer calling scraping.submit_job in its own
transaction (docs/integration.md) may keep it open as long as it likes. The claim's wake
takes each flow together with its tenant's row and passes over flows of tenants held
(before, 1,000 of them waking first filled its batch, woke nothing, and kept every other
flow asleep).

A claim waits for a tenant's row another transaction holds at most half a second, holding
locks or not (before, one holding none waited without a limit: every claim reaching the
class of a tenant a producer held stopped there, the other classes with it).

A flow on a domain without a state row (an operator deleted the row while intake announced
the domain's first jobs: the delete saw none of them, so made none again) gets its row
from the claim that meets it; before, the claim took the missing row for one another claim
held, at every claim, and the jobs never started.

The SQL is frozen in 0040_scraping_claims_never_wait_on_intake.sql / .down.sql beside this
file; the live definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0040
Revises: 0039
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
