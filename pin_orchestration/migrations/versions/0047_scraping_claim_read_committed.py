"""The claim and a pause's parking run only under READ COMMITTED (revises 0046): 0045 parks
a tenant by a statement whose snapshot is taken after its row's lock; in one snapshot for
the whole transaction (REPEATABLE READ, SERIALIZABLE) intake committed meanwhile was missed
and a tenant parked with a flow ready. The claim refuses to run there, naming the fix; a
pause there leaves the parking to the claims.

The SQL is frozen in 0047_scraping_claim_read_committed.sql / .down.sql beside this file;
the live definitions are pin_orchestration/scraping/sql/claim_jobs.sql and
domain_queues.sql.

Revision ID: 0047
Revises: 0046
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
