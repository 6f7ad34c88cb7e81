"""scraping schema (issue 7, SPEC §4, seed 004): tenants, jobs (the queue itself), attempts.

scraping.jobs is both the job record and the queue (SPEC SCR-4): intake inserts a row in
one transaction, worker runs claim due rows with FOR UPDATE SKIP LOCKED and a lease, so an
accepted job cannot be lost between accept and execution. Result bytes live in the
results store; only their metadata is kept here (SCR-10).

The SQL is frozen in 0006_scraping.sql / .down.sql beside this file.

Revision ID: 0006
Revises: 0005
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
