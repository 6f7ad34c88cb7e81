"""scraping.job_url_host refuses a host with an ASCII label longer than 63 characters, as
POST /jobs now does (scraping/hosts.py): DNS allows no longer label, and urllib3 refuses
one when it connects, so such a job was accepted (202) and failed at its first fetch as
invalid_url. A non-ASCII label was already held to 63 by IDNA 2008. It refuses as well an IPv4
address written otherwise than a.b.c.d (0x7f.1, 127.1, 2130706433: getaddrinfo reads
each as 127.0.0.1), which was keyed by its spelling: one address under as many
politeness keys, each with its own rate, as a client cared to write.

The SQL is frozen in 0033_scraping_intake_dns_label_limit.sql / .down.sql beside this file.

Revision ID: 0033
Revises: 0026
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0033"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
