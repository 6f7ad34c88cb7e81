"""news.snapshot_detach_outbox (issue 3, seed 001).

The local action-outbox of the snapshot-detach retry worker: one intent row per orphaned
selection snapshot, written in the owning operation's transaction and retried by the
`news_snapshot_detach_retry` job until selections confirms the detach.

The SQL is frozen in 0002_snapshot_detach_outbox.sql / .down.sql beside this file.

Revision ID: 0002
Revises: 0001
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
