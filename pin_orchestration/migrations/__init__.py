"""Alembic migrations for every schema the project creates (news, pin, chessboard)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

VERSION_TABLE_SCHEMA = "pin"


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
