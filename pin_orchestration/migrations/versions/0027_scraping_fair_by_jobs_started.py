"""scraping: tenants are served fairly by jobs *started*, whatever is blocked (issue 30).
Fair tags were spent at intake, so a tenant's jobs waiting on a paused or full domain
pushed its claimable jobs behind everyone else's (a claim of 20 gave 20 to the other
tenant), and when the domain woke their old tags jumped ahead (banked credit).

- `scraping.tenant_starts`: each tenant's start tag per class, advanced only when the
  claim starts one of its jobs (by 1/weight). A job's `fair_tag` is now only its place in
  its tenant's line.
- `scraping.domain_flows`: one row per (domain, class, tenant) with queued jobs, keyed by
  a lower bound of the tenant's start tag; a domain queue's `head_tag` is a lower bound of
  its flows' keys. The claim picks the smallest head, that queue's smallest flow, that
  tenant's first job there, and corrects a flow found more than a step behind its tenant
  (claim_jobs.sql).
- `ix_jobs_domain_head` leads with the tenant: (domain, priority, tenant_id, fair_tag, id).
- `scraping.announce_queued_jobs` takes the tenant instead of a head tag.

The SQL is frozen in 0027_scraping_fair_by_jobs_started.sql / .down.sql beside this file;
the live function definitions are pin_orchestration/scraping/sql/*.sql.

Revision ID: 0027
Revises: 0022
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0027"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
