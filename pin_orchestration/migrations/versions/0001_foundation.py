"""Foundation: news reference tables and the project's own pin tables.

news.posts / news.comments are owned upstream by the news service; we create them so the
project runs on its own, with every column beyond the ones we read nullable or defaulted
so a writer that knows only those columns can insert.

The SQL is frozen in 0001_foundation.sql / .down.sql beside this file.

Revision ID: 0001
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
