"""scraping redirect hops against their own host (issue 15): a job redirected to another
host takes a request token and a connection of THAT host (`scraping.take_redirect_slot`,
held in `scraping.redirect_slots` until the hop's fetch ends), and the claim counts those
connections with the domain's running jobs.

The SQL is frozen in 0016_scraping_redirect_slots.sql / .down.sql beside this file; the
live function definitions are pin_orchestration/scraping/sql/*.sql.

Revision ID: 0016
Revises: 0015
"""

from pathlib import Path

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_HERE = Path(__file__).with_suffix("")


def _run(path: Path) -> None:
    # On the driver's cursor without parameters: the SQL holds '%' and array slices that
    # text() or a parameterised execute would take for placeholders.
    with op.get_bind().connection.dbapi_connection.cursor() as cursor:
        cursor.execute(path.read_text(encoding="utf-8"))


def upgrade() -> None:
    _run(_HERE.with_suffix(".sql"))


def downgrade() -> None:
    _run(_HERE.with_suffix(".down.sql"))
