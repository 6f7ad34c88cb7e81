"""scraping: the per-tenant intake rate limit of POST /jobs (issue 11, "abuse of the API").

- scraping.intake_buckets: one token bucket per tenant, shared by every API process (a
  limit kept in a process's memory would multiply by the number of uvicorn workers and
  `pin api` instances). `tokens` is the level at `refilled_at`; a request refills it by
  the elapsed time × rate (capped at the burst) and takes one token, in one
  INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING (queries.sql: take_intake_token). The
  rate and burst are not stored: they come from each API process's settings
  (PIN_SCRAPING_INTAKE_RPS / _BURST), so changing them needs no migration. A tenant's row
  is made by its first request; the row is small and hot, kept apart from
  scraping.tenants so the key lookup never reads a row rewritten at every intake.

The SQL is frozen in 0010_scraping_intake_limit.sql / .down.sql beside this file.

Revision ID: 0010
Revises: 0009
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
