"""scraping: one result object per attempt, and a mark for the sweep of the objects a job
ended without (issue 16, items 2 and 8).

- scraping.jobs.attempt_objects_swept_at: when pin-retention deleted the objects of the
  job's attempts other than its result (losers of a lease race, attempts of a job that then
  failed or was cancelled, an attempt whose worker died between its put and its finish).
  The keys are derived from the job (`…/{job_id}/{attempt}` for attempts 1..attempts, and
  the pre-0012 `…/{job_id}`), so nothing is written per put. Existing terminal jobs start
  unswept: the first run deletes what older workers left behind.
- ix_jobs_attempt_objects_unswept: the sweep's scan, terminal jobs not yet swept, by when
  they finished.

The SQL is frozen in 0012_scraping_attempt_objects.sql / .down.sql beside this file.

Revision ID: 0012
Revises: 0011
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
