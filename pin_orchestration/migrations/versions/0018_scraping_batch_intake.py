"""scraping batch intake at the cost of one statement (issue 18): fair tags reserved a run
at a time (`scraping.take_fair_tags`, given by insert_jobs), and the domain queues of
inserted jobs announced once per (domain, class) by a statement-level trigger.

The SQL is frozen in 0018_scraping_batch_intake.sql / .down.sql beside this file; the live
function definitions are pin_orchestration/scraping/sql/domain_queues.sql.

Revision ID: 0018
Revises: 0017
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
