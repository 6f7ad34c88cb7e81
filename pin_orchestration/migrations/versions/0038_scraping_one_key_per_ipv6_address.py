"""One politeness key per IPv6 address, whatever its spelling: `[::1]`,
`[0:0:0:0:0:0:0:1]` and `[::0001]` were keyed as written (lowercased), three hosts with
three rates and three pauses for one address. scraping.ipv6_key gives the compressed form
Python's ipaddress writes (hosts.ipv6_key), an IPv4-mapped address as its IPv4 address;
scraping.job_url_host (scraping.submit_job) and scraping.idna_host (a worker's pause or
redirect hop) key IPv6 hosts by it. Jobs already stored keep their domain.

The SQL is frozen in 0038_scraping_one_key_per_ipv6_address.sql / .down.sql beside this
file; the live definitions are pin_orchestration/scraping/sql/submit_job.sql.

Revision ID: 0038
Revises: 0035
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
