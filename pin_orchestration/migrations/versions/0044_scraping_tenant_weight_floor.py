"""A tenant's weight is at least 0.001, as it is at most 1000 (scraping.tenants'
tenants_weight_check): a weight of 1e-300, accepted while only > 0 was checked, pushed the
class clock past 2**53, where the other tenants' steps were lost and one took every pick.

The SQL is frozen in 0044_scraping_tenant_weight_floor.sql / .down.sql beside this file.

Revision ID: 0044
Revises: 0043
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
