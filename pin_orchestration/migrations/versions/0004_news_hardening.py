"""news hardening (issue 8): the window of an interrupted DailyWindow pass is kept with
its checkpoint, so the run that resumes it covers what the cut run owed.

Revision ID: 0004n
Revises: 0003
"""

from alembic import op

revision = "0004n"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE pin.job_checkpoints
            ADD COLUMN window_start timestamptz,
            ADD COLUMN window_end timestamptz
        """
    )


def downgrade() -> None:
    op.execute("ALTER TABLE pin.job_checkpoints DROP COLUMN window_start, DROP COLUMN window_end")
