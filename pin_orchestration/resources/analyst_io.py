"""IO managers that let analysts `defs.load_asset_value(key, partition_key=...)` every asset
as a pandas DataFrame.

The jobs' own assets live in PostgreSQL tables the jobs keep: `PostgresAssetReader` reads
a partition's value from them on load and stores nothing on materialization (the
materialization already wrote the tables). The analysts' derived assets are computed
frames: `ParquetFrameIOManager` keeps one Parquet file per partition on the results store
(S3, or $PIN_HOME without a bucket), readable by any Parquet tool, each written with the
columns its asset declares (`column_schema`, the asset's `dagster/column_schema`).

A step of one partition loads and stores a DataFrame. A step of several (a run of a range
of partitions, as an asset with `BackfillPolicy.single_run()` gets from a backfill or from
automation) loads and stores `{partition key: DataFrame}`, as Dagster's own UPath IO
managers do; each partition's file, and its materialization's metadata, are then exactly
those of a run of that partition alone.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

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

    def load_input(self, context: InputContext) -> pd.DataFrame | dict[str, pd.DataFrame]:
        key = context.asset_key.to_user_string()
        if key not in FRAME_OF_PARTITION:
            raise ValueError(f"PostgresAssetReader cannot load {key}")
        frame_of = FRAME_OF_PARTITION[key]
        engine = self.database.get_engine()
        partitions = context.asset_partition_keys
        if len(partitions) == 1:
            return frame_of(engine, partitions[0])
        return {partition: frame_of(engine, partition) for partition in partitions}


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

    def handle_output(
        self, context: OutputContext, obj: pd.DataFrame | Mapping[str, pd.DataFrame]
    ) -> None:
        asset = context.asset_key.to_user_string()
        schema = declared_arrow_schema(asset, context.definition_metadata)
        store = self.frame_store()
        partitions = _partitions(context)
        if len(partitions) == 1:
            uri = store.write(context.asset_key.path, partitions[0], obj, schema)
            context.add_output_metadata({"rows": len(obj), "path": uri})
            return
        frames = _frames_of_partitions(asset, partitions, obj)
        # All or none: a run that fails records no materialization of any partition, so it
        # must change none of their files (as a failed run of one partition does not).
        uris = store.write_many(context.asset_key.path, frames, schema)
        for partition, frame in frames.items():
            # Each partition's materialization gets its own rows and file (output metadata
            # would give every partition the same), as a run of that partition alone does.
            context.step_context.add_asset_metadata(
                {"rows": len(frame), "path": uris[partition]},
                asset_key=context.asset_key,
                partition_key=partition,
            )

    def load_input(self, context: InputContext) -> pd.DataFrame | dict[str, pd.DataFrame]:
        store, partitions = self.frame_store(), _partitions(context)
        frames = {partition: _read(store, context, partition) for partition in partitions}
        return frames[partitions[0]] if len(partitions) == 1 else frames


def _read(store: FrameStore, context: InputContext, partition: str | None) -> pd.DataFrame:
    try:
        return store.read(context.asset_key.path, partition)
    except FrameMissing as missing:
        raise FrameNotMaterialized(_not_materialized(context, partition, missing.uri)) from None


def _partitions(context: InputContext | OutputContext) -> Sequence[str | None]:
    """The step's partitions of the asset; [None] for an unpartitioned asset."""
    return context.asset_partition_keys if context.has_asset_partitions else [None]


def _frames_of_partitions(
    asset: str, partitions: Sequence[str | None], obj: object
) -> Mapping[str, pd.DataFrame]:
    """The frames a step of several partitions returned, one for each of them."""
    wanted = f"{asset}: a step of {len(partitions)} partitions returns {{partition key: frame}}"
    if not isinstance(obj, Mapping):
        raise TypeError(f"{wanted}, not a {type(obj).__name__}")
    if set(obj) != set(partitions):
        missing = sorted(str(p) for p in set(partitions) - set(obj))
        extra = sorted(str(p) for p in set(obj) - set(partitions))
        raise ValueError(f"{wanted} for exactly those: missing {missing[:5]}, extra {extra[:5]}")
    return obj


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
