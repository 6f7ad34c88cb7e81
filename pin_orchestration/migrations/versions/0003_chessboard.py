"""chessboard schema (issue 4): reference tables, the recalc queue, the event outbox.

chessboard.projects / buildings / layouts / layout_groups / property_objects are owned
upstream by the chessboard service; we create them so the project runs on its own, with
every column beyond the ones the recalc reads or writes nullable or defaulted so a writer
that knows only those columns can insert.

chessboard.project_recalc_requests is the job-owned debounce queue exactly as seed 002
defines it (one row per project, PK = the coalescing key). chessboard.event_outbox is the
transactional outbox of Project/Layout/LayoutGroup upserted events; chessboard.recalc_metrics
keeps the counters Prometheus reads (runs are short-lived processes).

The SQL is frozen in 0003_chessboard.sql / .down.sql beside this file.

Revision ID: 0003
Revises: 0002
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
