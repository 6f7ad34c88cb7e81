"""news.snapshot_detach_outbox (issue 3, seed 001).

The local action-outbox of the snapshot-detach retry worker: one intent row per orphaned
selection snapshot, written in the owning operation's transaction and retried by the
`news_snapshot_detach_retry` job until selections confirms the detach.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE news.snapshot_detach_outbox (
            id uuid PRIMARY KEY,
            snapshot_id uuid NOT NULL,
            post_id uuid NOT NULL,
            reason varchar(16) NOT NULL
                CHECK (reason IN ('BlockReplaced', 'PostDeleted')),
            attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            next_attempt_at timestamptz NOT NULL DEFAULT now(),
            status varchar(16) NOT NULL DEFAULT 'Pending'
                CHECK (status IN ('Pending', 'Done', 'Quarantined')),
            last_error varchar(512),
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # One active intent per snapshot (the detach is one-shot): dedupe key of the enqueue.
    op.execute(
        "CREATE UNIQUE INDEX ux_sdo_snapshot ON news.snapshot_detach_outbox (snapshot_id) "
        "WHERE status <> 'Done'"
    )
    # The claim and the sensor read due rows: status = 'Pending' AND next_attempt_at <= now.
    op.execute("CREATE INDEX ix_sdo_due ON news.snapshot_detach_outbox (status, next_attempt_at)")
    op.execute("CREATE INDEX ix_sdo_post ON news.snapshot_detach_outbox (post_id)")


def downgrade() -> None:
    op.execute("DROP TABLE news.snapshot_detach_outbox")
