"""scraping scheduler at scale (issue 15): a claim whose cost per job does not grow with
active tenants, queued domains or paused domains, and no global lock.

- Fair positions at write time: `scraping.jobs.fair_tag`, the job's start tag among its
  tenant's jobs in its class (trigger jobs_fair_tag; tenant_vtimes keeps each tenant's
  finish tag), so the tenant pick is an ordered index scan.
- `scraping.domain_queues`: one row per (domain, class) with queued jobs, its head tag,
  and whether it is in the pick (`ready`) or set aside until `wake_at` (paused, bucket
  empty, connections full, nothing due). Kept by triggers on scraping.jobs and
  scraping.domains.
- `scraping.claim_jobs` (same signature) picks class -> domain queue -> job under row
  locks taken with SKIP LOCKED; `scraping.submit_job` (the one intake path) and
  `scraping.pause_domain` (capped) are new.

The SQL is frozen in 0011_scraping_scheduler_v2.sql / .down.sql beside this file; the live
function definitions are pin_orchestration/scraping/sql/*.sql.

Revision ID: 0011
Revises: 0010
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
