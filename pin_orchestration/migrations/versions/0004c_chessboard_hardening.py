"""chessboard hardening (issue 8): the drain's claim lease and a failed row's not-before.

A drain claims a queue row by committing a lease (claimed_until, claim_token) in a short
transaction and recalculates without holding the row, so a raiser's upsert never waits for
a recalc nor deadlocks with one; a lease left by a killed drain expires. not_before keeps a
failed row from being retried, by any drain, before a tick has passed (due_at stays as
the raisers set it). claimable_at is when a row may next be claimed: the one column the
claim, the sensor's count and the wake-up time order and filter by.

The SQL is frozen in 0004c_chessboard_hardening.sql / .down.sql beside this file.

Revision ID: 0004c
Revises: 0004n
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0004c"
down_revision = "0004n"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
