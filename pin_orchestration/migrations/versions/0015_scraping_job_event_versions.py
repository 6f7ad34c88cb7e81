"""scraping job events carry the job's version (issue 16, item 9): the read cache compares
it so that a fill never overwrites a newer state.

- The `scraping_job_finished` payload gains `updated_at` (the row's, as the event left it):
  the listener's tombstone records it, and a fill whose row is older is refused.
- `updated_at` strictly increases on every status change. Writers set `updated_at = now()`,
  the start of their transaction: one that waited for the row's lock can write a time
  earlier than the write it waited for, and its event would then look older than the copy
  it must invalidate. The trigger runs only for those rare updates (its WHEN is false for
  the others), so the hot paths pay nothing.

The SQL is frozen in 0015_scraping_job_event_versions.sql / .down.sql beside this file.

Revision ID: 0015
Revises: 0014
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
