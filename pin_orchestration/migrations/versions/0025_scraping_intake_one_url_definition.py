"""scraping.submit_job checks a URL as POST /jobs does (issue 30): scraping.job_url_host,
hosts.check_url rule for rule, replaces scraping.check_job_url, and gives the job's domain
key. It refuses what the API refuses and the old check let through (credentials in the
URL or callback, backslashes in the host, hosts outside letters, digits, '-', '_' and
dots, percent-encoded hosts, bracketed text that is no IPv6 address), and a host with
non-ASCII characters, whose IDNA 2008 form is the `idna` package's (POST /jobs keys it):
give it as xn--…. Its domain no longer comes from scraping.idna_host's punycode, which
lowercased with PostgreSQL's lower() (İ) where the fetcher does not.

The SQL is frozen in 0025_scraping_intake_one_url_definition.sql / .down.sql beside this
file.

Revision ID: 0025
Revises: 0023
"""

from pin_orchestration.migrations import run_frozen_sql

revision = "0025"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_frozen_sql(__file__, "up")


def downgrade() -> None:
    run_frozen_sql(__file__, "down")
