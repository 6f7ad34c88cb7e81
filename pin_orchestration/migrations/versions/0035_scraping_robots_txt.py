"""robots.txt shared by the whole fleet (issue 31): scraping.robots holds one row per origin
(its rules, when to fetch it again, the lease of the worker fetching it, the failures of an
unreachable one); scraping.domains gets the operator's exemption (robots_mode, who, why),
the host's Crawl-delay, and `rps` becomes derived: min(configured_rps, 1 / Crawl-delay),
by trigger, so the claim keeps reading one column.

The SQL is frozen in 0035_scraping_robots_txt.sql / .down.sql beside this file.

Revision ID: 0035
Revises: 0034
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
