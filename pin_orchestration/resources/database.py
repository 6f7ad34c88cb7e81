from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field
from sqlalchemy import Engine

from pin_orchestration.platform.db import create_db_engine, resolve_database_url


class DatabaseResource(ConfigurableResource):
    """The platform PostgreSQL. Unset url → PIN_DATABASE_URL, else the embedded default."""

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://…); empty to use PIN_DATABASE_URL "
        "or, when that is unset too, the embedded PostgreSQL",
    )

    def get_engine(self) -> Engine:
        return create_db_engine(self.url or resolve_database_url())
