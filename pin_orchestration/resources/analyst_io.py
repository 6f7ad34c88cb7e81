"""IO managers that let analysts `defs.load_asset_value(key, partition_key=...)` every asset
as a pandas DataFrame.

The jobs' own assets live in PostgreSQL tables the jobs keep: `PostgresAssetReader` reads
a partition's value from them on load and stores nothing on materialization (the
materialization already wrote the tables). The analysts' derived assets are computed
frames: `ParquetFrameIOManager` keeps one Parquet file per partition on the results store
(S3, or $PIN_HOME without a bucket), readable by any Parquet tool, each written with the
columns its asset declares (`column_schema`, the asset's `dagster/column_schema`).
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable, Iterable, Mapping

import pandas as pd
import pyarrow as pa
from dagster import (
    ConfigurableIOManager,
    Failure,
    InputContext,
    OutputContext,
    TableColumn,
    TableSchema,
)
from pydantic import Field
from sqlalchemy import Engine

from pin_orchestration.analyst import (
    project_aggregates_frame,
    reconcile_runs_frame,
    scraping_results_frame,
)
from pin_orchestration.platform.frames import (
    FrameColumn,
    FrameMissing,
    FrameStore,
    arrow_schema,
    build_frame_store,
)
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource


def _project_aggregates(engine: Engine, partition_key: str) -> pd.DataFrame:
    try:
        project_id = uuid.UUID(partition_key)
    except ValueError:
        raise Failure(
            description=f"partition key must be a project id (uuid), got {partition_key!r}"
        ) from None
    return project_aggregates_frame(engine, project_id)


# The frame of one partition of each asset this manager reads, by asset key. The asset
# modules bundle this manager (io_manager_def), so the keys are spelled here rather than
# imported from them (resources never import assets); tests/test_import_rules.py checks
# that these are exactly the assets using this manager.
FRAME_OF_PARTITION: dict[str, Callable[[Engine, str], pd.DataFrame]] = {
    "news/post_comment_counts": reconcile_runs_frame,
    "chessboard/project_aggregates": _project_aggregates,
    "scraping/results": scraping_results_frame,
}


class PostgresAssetReader(ConfigurableIOManager):
    """Values of news/post_comment_counts, chessboard/project_aggregates and
    scraping/results, read from PostgreSQL per partition (day; project id; UTC day)."""

    database: DatabaseResource = Field(default_factory=DatabaseResource)

    def handle_output(self, context: OutputContext, obj: object) -> None:
        """Nothing to store: the run wrote the tables this manager reads."""

    def load_input(self, context: InputContext) -> pd.DataFrame:
        key = context.asset_key.to_user_string()
        if key not in FRAME_OF_PARTITION:
            raise ValueError(f"PostgresAssetReader cannot load {key}")
        frame_of = FRAME_OF_PARTITION[key]
        return frame_of(self.database.get_engine(), context.asset_partition_key)


# Where Dagster's UI reads an asset's columns from; the IO manager writes the same.
COLUMN_SCHEMA = "dagster/column_schema"


def column_schema(columns: Iterable[FrameColumn]) -> dict[str, TableSchema]:
    """A derived asset's metadata entry declaring its frame's columns."""
    return {
        COLUMN_SCHEMA: TableSchema(
            columns=[TableColumn(c.name, c.type, description=c.description) for c in columns]
        )
    }


def declared_arrow_schema(asset: str, metadata: Mapping[str, object]) -> pa.Schema:
    schema = metadata.get(COLUMN_SCHEMA)
    if not isinstance(schema, TableSchema):
        raise ValueError(
            f"{asset} declares no columns: give the asset "
            "metadata=column_schema(<its FrameColumn tuple>) so every file has one schema"
        )
    return arrow_schema((c.name, c.type) for c in schema.columns)


class FrameNotMaterialized(LookupError):
    """An analyst asked for a derived frame no run has stored yet."""


class ParquetFrameIOManager(ConfigurableIOManager):
    """Derived DataFrames as Parquet, one file per asset partition, in the results store's
    bucket (PIN_S3_BUCKET …) or under $PIN_HOME (`pin_orchestration.platform.frames`)."""

    scraping: ScrapingResource = Field(default_factory=ScrapingResource)

    def frame_store(self) -> FrameStore:
        settings = self.scraping.get_settings()
        return build_frame_store(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region_name=settings.s3_region,
            home=Settings.from_env().home,
        )

    def handle_output(self, context: OutputContext, obj: pd.DataFrame) -> None:
        schema = declared_arrow_schema(
            context.asset_key.to_user_string(), context.definition_metadata
        )
        uri = self.frame_store().write(context.asset_key.path, _partition(context), obj, schema)
        context.add_output_metadata({"rows": len(obj), "path": uri})

    def load_input(self, context: InputContext) -> pd.DataFrame:
        partition = _partition(context)
        try:
            return self.frame_store().read(context.asset_key.path, partition)
        except FrameMissing as missing:
            raise FrameNotMaterialized(_not_materialized(context, partition, missing.uri)) from None


def _partition(context: InputContext | OutputContext) -> str | None:
    return context.asset_partition_key if context.has_asset_partitions else None


def _not_materialized(context: InputContext, partition: str | None, uri: str) -> str:
    asset = context.asset_key.to_user_string()
    command = ["dagster", "asset", "materialize", "-m", "pin_orchestration.definitions"]
    command += ["--select", asset]
    if partition is not None:
        command += ["--partition", partition]
    which = f"partition {partition!r} of {asset}" if partition is not None else asset
    return (
        f"{which} is not materialized yet (no frame at {uri}); materialize it with "
        f"`{shlex.join(command)}` (in the environment of `pin env`), or from the UI "
        "(the asset's Materialize button)"
    )
