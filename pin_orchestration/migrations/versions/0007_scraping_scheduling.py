"""scraping scheduling (issue 9, SPEC SCR-7…SCR-9): per-domain limits, tenant fairness,
6:3:1 priorities, all in the one claim function `scraping.claim_jobs`.

- `scraping.jobs.domain`: the URL's host, lowercased, IDNA-encoded, set at intake.
- `scraping.domains`: per-domain overrides (`pin scraping domain set`) and the shared
  politeness state every worker reads and writes: the token bucket (`tokens` at
  `tokens_at`) and `blocked_until` (a 429 or Retry-After from the domain).
- `scraping.tenants.weight` (`pin tenant set-weight`), `scraping.pick_classes` and
  `scraping.tenant_vtimes`: the virtual clocks of the fair pick.

The SQL is frozen in 0007_scraping_scheduling.sql / .down.sql beside this file. One step
stays in Python, where the .sql says `-- python: backfill_domains`: it reads the
jobs accepted before this revision and sets each one's domain from its URL with
the idna package (UTS #46), which the SQL of this revision cannot do.

Revision ID: 0007
Revises: 0006
"""

from urllib.parse import urlsplit

import sqlalchemy as sa
from alembic import op

from pin_orchestration.migrations import run_frozen_sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up", backfill_domains=_backfill_domains)


def downgrade() -> None:
    run_frozen_sql(__file__, "down")


def _backfill_domains() -> None:
    """Jobs accepted before this revision get the host of their URL (lowercased, IDNA)."""
    import idna

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, url FROM scraping.jobs")).all()
    for job_id, url in rows:
        host = (urlsplit(url).hostname or "").rstrip(".")
        try:
            domain = idna.encode(host, uts46=True).decode("ascii") if host else ""
        except idna.IDNAError:
            domain = host.lower()
        conn.execute(
            sa.text("UPDATE scraping.jobs SET domain = :domain WHERE id = :id"),
            {"domain": domain, "id": job_id},
        )
