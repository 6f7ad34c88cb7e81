"""The claim copies the array of jobs it has picked once per query, not once per row
(revises 0040): each pick's queries exclude the jobs picked so far with
`j.id <> ALL (picked)`, and PostgreSQL flattened the PL/pgSQL variable's array for every
row it compared, so a claim of n jobs copied O(n^2) arrays (a sixth of the database's
CPU in bench/scraping_workers.py, issue 30). As CAST((SELECT picked) AS uuid[]) the array
is an init plan's value, flattened once per query. The jobs excluded are the same.

The SQL is frozen in 0041_scraping_claim_copies_picked_once_per_query.sql / .down.sql
beside this file; the live definition is pin_orchestration/scraping/sql/claim_jobs.sql.

Revision ID: 0041
Revises: 0040
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
