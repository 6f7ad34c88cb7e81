"""scraping: Standard Webhooks secrets and their rotation overlap (issue 18).

- scraping.tenants.webhook_secret_previous: the secret a rotation replaced. Deliveries are
  signed with it too (a second signature in `webhook-signature`) while
  webhook_secret_rotated_at is less than PIN_WEBHOOK_SECRET_OVERLAP_SECONDS ago, so a
  receiver that still holds the old secret keeps verifying until it has the new one.
- New tenants' secrets are `whsec_` + base64 of 32 random bytes (two random UUIDs' bytes,
  244 random bits, with no extension needed). The secrets made by 0009 (`whsec_` + 64 hex
  digits) are valid base64 too, so they stay as they are: receivers' keys do not change.

The SQL is frozen in 0014_webhook_secret_rotation.sql / .down.sql beside this file.

Revision ID: 0014
Revises: 0013
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
