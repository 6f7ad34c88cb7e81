"""scraping job events (issue 9, seed step 19): a NOTIFY when a job enters or leaves a
terminal status, and an index for the metrics' recent-attempts window.

The API's read cache keeps a finished job for a long time; whatever makes a job finish
(a worker, the sweeper, a cancel) or un-finish (the runbook requeue) must drop the cached
copy. Writers do not know the cache: a trigger on scraping.jobs issues
`pg_notify('scraping_job_finished', …)` inside the writing transaction, so the event is
delivered exactly when that transaction commits and never for one that rolls back. The
API's listener thread turns it into a cache invalidation.

The payload is JSON `{"job_id", "tenant_id", "status"}`: the cache key carries the tenant
(`job:{tenant}:{id}`), so the listener needs both without a query.

The SQL is frozen in 0008_scraping_job_events.sql / .down.sql beside this file.

Revision ID: 0008
Revises: 0007
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
