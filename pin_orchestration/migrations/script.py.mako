"""${message}

The SQL is frozen in the .sql / .down.sql files named like this one, beside it: write
them by hand (tests/migrations/test_schema.py checks that each exists and goes down and
up again). A step that must read rows and branch in Python runs where its .sql has a line
`-- python: NAME`: pass it as `run_frozen_sql(__file__, "up", NAME=function)`.

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from pin_orchestration.migrations import run_frozen_sql

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
