"""Alembic migrations for every schema the project creates (news, pin, chessboard, scraping).

Each revision's SQL is frozen beside it: `versions/<name>.sql` (up) and
`versions/<name>.down.sql` (down), run by `run_frozen_sql`. The .py keeps the docstring,
the revision ids and, where a step needs Python (it reads rows and branches), that step.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from alembic import command, op
from alembic.config import Config
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

VERSION_TABLE_SCHEMA = "pin"

# A line of a frozen file where a Python step of its migration runs.
_PYTHON_STEP = re.compile(r"^-- python: (\w+)[ \t]*$", re.MULTILINE)


def run_frozen_sql(
    migration_file: str,
    direction: Literal["up", "down"],
    **python_steps: Callable[[], None],
) -> None:
    """Run the frozen SQL of one migration (`<stem>.sql` or `<stem>.down.sql` beside it).

    The SQL goes to the driver's cursor without parameters: it holds '%' and array slices
    (`a[lo:hi]`) that text() or a parameterised execute would take for placeholders. A line
    `-- python: NAME` runs `python_steps[NAME]` there, between the SQL before and after it.
    """
    stem = Path(migration_file).with_suffix("")
    path = stem.with_name(stem.name + (".sql" if direction == "up" else ".down.sql"))
    parts = _PYTHON_STEP.split(path.read_text(encoding="utf-8"))
    named = set(parts[1::2])
    if named != set(python_steps):
        raise ValueError(f"{path.name} names steps {sorted(named)}, given {sorted(python_steps)}")
    cursor = op.get_bind().connection.dbapi_connection.cursor()
    try:
        for index, part in enumerate(parts):
            if index % 2:
                python_steps[part]()
            elif part.strip():
                cursor.execute(part)
    finally:
        cursor.close()


def log_applied(*, step: Any, **_: Any) -> None:
    """Alembic's on_version_apply callback: one line per migration, its docstring's first
    line. Alembic's own "Running upgrade" line holds the docstring's whole first paragraph
    (several lines for most migrations), so its logger is kept below INFO (cli/logs.py)."""
    revision = step.up_revision
    doc = (revision.doc or "").strip() if revision is not None else ""
    first, _, more = doc.partition("\n")
    log.info(
        "%s migration %s: %s%s",
        "applied" if step.is_upgrade else "reverted",
        step.up_revision_id,
        first,
        " …" if more else "",
    )


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", "pin_orchestration:migrations")
    # ConfigParser interpolates '%': escape it so URL-encoded passwords survive.
    rendered = make_url(database_url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade_database(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"version_table_schema": VERSION_TABLE_SCHEMA}
        )
        return context.get_current_revision()
