"""The tenants' start tags and the class start clock are numeric, not double precision: a
pick's step of 1/weight is added exactly, so no tenant stands still at a large clock.

In a double, x + 0.001 == x from 2**44 (a weight-1000 tenant's step, after a floor-weight
tenant alone ran the clock up) and x + 1 == x from 2**53 (the clocks a pre-0044 weight of
1e-300 left): the tenants coming back at the clock stopped advancing and one took every
pick. The jobs' fair tags (jobs.fair_tag, tenant_vtimes, the tag clock, the flows' and
queues' heads) stay double precision: they order one tenant's own jobs, never whose turn
it is.

The SQL is frozen in 0046_scraping_exact_start_tags.sql / .down.sql beside this file; the
live definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0046
Revises: 0045
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
