"""SQL functions as the raising contract (issue 12).

Other services (not written in Python) raise a chessboard recalc or a snapshot detach by
calling one function in their own transaction:

    SELECT chessboard.request_project_recalc($1, $2, 'Crud');
    SELECT news.enqueue_snapshot_detach($1, $2, 'PostDeleted');

Both are SECURITY DEFINER with a fixed search_path, so a role that holds EXECUTE on them
(and USAGE on the schemas: `pin db grant-raiser ROLE`) can raise without any privilege on
the tables. EXECUTE is revoked from PUBLIC: raising is granted, not implied.

The Python helpers (`request_project_recalc`, `enqueue_snapshot_detach`) call the same
SQL, so the two ways to raise cannot drift. `chessboard.request_project_recalc_at` holds
the debounce upsert with the clock and the policy as arguments: the Python helper (tests
and benchmarks move the clock) calls it with its caller's privileges; raisers get the
fixed policy (30 s, 5 min) of the public function.

The SQL is frozen in 0005_raiser_functions.sql / .down.sql beside this file.

Revision ID: 0005
Revises: 0004c
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0005"
down_revision = "0004c"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
