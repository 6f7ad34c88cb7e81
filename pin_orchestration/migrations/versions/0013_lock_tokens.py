"""pin.distributed_locks.token: a fencing token per acquisition (issue 20, hung databases).

Every acquisition (a fresh insert or a takeover of an expired lock) draws a new random
token; renewal, release and every write that must have one holder name the token, not the
holder string, so a holder that lost its lock (a renewal stuck on a hung server past the
TTL) writes nothing once another process took the lock over — even when the same holder
string acquires again later.

The token is UNIQUE on purpose: a column of a unique index is a key column to PostgreSQL's
row locks, so a takeover (which changes the token) takes FOR UPDATE and waits for a fenced
write's FOR KEY SHARE, while a renewal (which changes only expires_at) takes FOR NO KEY
UPDATE and never waits for one.

The SQL is frozen in 0013_lock_tokens.sql / .down.sql beside this file.

Revision ID: 0013
Revises: 0012
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
