"""scraping.jobs: ix_jobs_lease serves lease comparisons only (`lease_expires_at IS NOT
NULL` in its predicate), so a count of a domain's running jobs — the claim's connection
count — can no longer be planned on it. While the statistics said nothing was running
(analysed before a burst), the count's generic plan took the lease index, the smaller of
two indexes that both looked empty, and read every running job (issue 15). Every lease
query compares `lease_expires_at` with a strict operator, which implies the new predicate.

The SQL is frozen in 0021_scraping_lease_index_serves_leases_only.sql / .down.sql beside
this file.

Revision ID: 0021
Revises: 0020
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
