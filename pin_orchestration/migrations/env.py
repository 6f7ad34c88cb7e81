from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from pin_orchestration.migrations import VERSION_TABLE_SCHEMA, log_applied

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url, poolclass=pool.NullPool)

with engine.connect() as connection:
    # The version table lives in schema pin, which must exist before alembic looks for it.
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_TABLE_SCHEMA}"))
    connection.commit()
    context.configure(
        connection=connection,
        version_table_schema=VERSION_TABLE_SCHEMA,
        transaction_per_migration=True,
        on_version_apply=log_applied,
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
