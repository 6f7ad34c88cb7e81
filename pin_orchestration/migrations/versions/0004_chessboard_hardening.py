"""chessboard hardening (issue 8): the drain's claim lease and a failed row's not-before.

A drain claims a queue row by committing a lease (claimed_until, claim_token) in a short
transaction and recalculates without holding the row, so a raiser's upsert never waits for
a recalc nor deadlocks with one; a lease left by a killed drain expires. not_before keeps a
failed row from being retried, by any drain, before a tick has passed (due_at stays as
the raisers set it). claimable_at is when a row may next be claimed: the one column the
claim, the sensor's count and the wake-up time order and filter by.

Revision ID: 0004c
Revises: 0004n
"""

from alembic import op

revision = "0004c"
down_revision = "0004n"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE chessboard.project_recalc_requests
            ADD COLUMN not_before timestamptz,
            ADD COLUMN claimed_until timestamptz,
            ADD COLUMN claim_token uuid,
            ADD COLUMN claimable_at timestamptz
                GENERATED ALWAYS AS (greatest(due_at, not_before, claimed_until)) STORED
        """
    )
    op.execute("DROP INDEX chessboard.ix_project_recalc_due")
    op.execute(
        "CREATE INDEX ix_project_recalc_claimable "
        "ON chessboard.project_recalc_requests (claimable_at)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX chessboard.ix_project_recalc_claimable")
    op.execute("CREATE INDEX ix_project_recalc_due ON chessboard.project_recalc_requests (due_at)")
    op.execute(
        """
        ALTER TABLE chessboard.project_recalc_requests
            DROP COLUMN claimable_at,
            DROP COLUMN claim_token,
            DROP COLUMN claimed_until,
            DROP COLUMN not_before
        """
    )
