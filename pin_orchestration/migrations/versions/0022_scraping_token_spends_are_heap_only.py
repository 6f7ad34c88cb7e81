"""scraping.domains: a claim's token spend (tokens, tokens_at) is a heap-only update. No
claim since 0011 reads ix_domains_tokens_at (0007's "domains spent within 100 s"), yet it
made every pick's spend a new tuple with a new entry in each of the table's indexes — the
primary key every claimer looks domains up by included. The index goes, and the table
keeps half of each page free (fillfactor 50) so the new version fits beside the old one
while concurrent claims still see it (issue 15).

The SQL is frozen in 0022_scraping_token_spends_are_heap_only.sql / .down.sql beside this
file.

Revision ID: 0022
Revises: 0021
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
