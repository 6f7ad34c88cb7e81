"""scraping.pause_domain only lengthens a pause: an `until` already past (an outcome held
through a database blip) changes nothing, where it used to lift the pause another worker
had set; lifting is scraping.resume_domain's, an operator's. scraping.take_redirect_slot
spends a token of the job's own host for a hop back to it (five same-host hops went out
on the claim's one token), holding no connection slot there: the claim holds it.
ix_job_attempts_finished: the metrics' failure shares count attempts that ended in their
window, as their help says (they counted those that started in it); ix_job_attempts_started
served that window only, and goes.

The SQL is frozen in 0026_scraping_pauses_only_lengthen_and_every_hop_spends_a_token.sql
/ .down.sql beside this file.

Revision ID: 0026
Revises: 0022
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0026"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
