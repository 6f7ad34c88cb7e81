"""Fair by jobs started, whatever is blocked (issue 30 item 7): the claim picks the tenant
whose turn it is, then one of its flows (its jobs on one domain) whose domain has room, and
spends the tenant's turn when it starts the job. A tenant whose flows are all on domains
without room (paused, bucket empty, connections full) or not due is parked, its start tag
standing still: jobs waiting on a blocked domain neither cost nor bank a turn. Fair tags
taken at intake now order a tenant's own jobs only.

The SQL is frozen in 0039_scraping_fair_by_jobs_started.sql / .down.sql beside this file;
the live definitions are pin_orchestration/scraping/sql/{domain_queues,claim_jobs,
redirect_slots,submit_job}.sql.

Revision ID: 0039
Revises: 0038
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
