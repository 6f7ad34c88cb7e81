"""The analysts' derived DataFrames as Parquet files, where any tool can read them.

One file per asset partition, `assets/<asset key path>/<partition>.parquet`, in the results
store's S3 bucket (PIN_S3_BUCKET) or, without one, under $PIN_HOME. pyarrow writes them
(its own S3 client, so no second botocore to keep in step with boto3's); pyarrow,
`pandas.read_parquet` and DuckDB read them without this package. No Dagster here: the IO
manager in `pin_orchestration.resources.analyst_io` calls this.

Every file of an asset is written with the asset's declared columns and types, a day with
no rows included: a reader of many files (DuckDB's glob, `pandas.read_parquet(folder)`)
takes one file's schema for all, and an empty frame's columns would otherwise be of
type null, which no string or number column can be cast to.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

FRAMES_PREFIX = "assets"
# The name of an unpartitioned asset's one file.
UNPARTITIONED = "all"
# As the results store's own client (store.py): a hung store must not hold a run for minutes.
S3_CONNECT_TIMEOUT_SECONDS = 5.0
S3_REQUEST_TIMEOUT_SECONDS = 20.0


# The types a frame's column may be declared with, by the name the asset's column schema
# shows in the UI. Few on purpose: each reads the same in pandas, DuckDB and Spark.
COLUMN_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
}


@dataclass(frozen=True)
class FrameColumn:
    name: str
    type: str  # a key of COLUMN_TYPES
    description: str

    def __post_init__(self) -> None:
        column_type(self.name, self.type)


def column_type(name: str, type_name: str) -> pa.DataType:
    if type_name not in COLUMN_TYPES:
        raise ValueError(
            f"column {name!r}: type {type_name!r} is not one of {sorted(COLUMN_TYPES)}"
        )
    return COLUMN_TYPES[type_name]


def arrow_schema(columns: Iterable[tuple[str, str]]) -> pa.Schema:
    """The Parquet schema of a frame declared as (name, type) pairs (types: COLUMN_TYPES)."""
    return pa.schema([pa.field(name, column_type(name, type_name)) for name, type_name in columns])


class FrameSchemaError(ValueError):
    """A frame's columns are not the ones its asset declares."""


def frame_table(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """`frame` as an Arrow table of exactly `schema` (an empty frame included)."""
    if list(frame.columns) != schema.names:
        raise FrameSchemaError(
            f"the frame's columns {list(frame.columns)} are not the declared "
            f"{schema.names}: compute the declared columns, in that order, or change the "
            "declaration (and docs/analysts.md)"
        )
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


class FrameMissing(LookupError):
    """No frame is stored for this asset partition (it was never materialized here)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.uri = uri


@dataclass(frozen=True)
class FrameStore:
    filesystem: pafs.FileSystem
    # `bucket/prefix` on S3, an absolute directory locally: where `assets/` lives.
    root: str
    # How a path is shown to a person (`s3://…` or the local path).
    scheme: str = ""

    def path(self, asset_path: Sequence[str], partition: str | None) -> str:
        # Partition keys are the project's own (days, project ids), quoted anyway so that
        # no key can name a path outside its asset's folder.
        name = quote(partition, safe="") if partition is not None else UNPARTITIONED
        return "/".join([self.root, FRAMES_PREFIX, *asset_path, f"{name}.parquet"])

    def uri(self, asset_path: Sequence[str], partition: str | None) -> str:
        return self.scheme + self.path(asset_path, partition)

    def write(
        self,
        asset_path: Sequence[str],
        partition: str | None,
        frame: pd.DataFrame,
        schema: pa.Schema,
    ) -> str:
        """Store `frame` whole with the asset's `schema` (a reader sees the previous frame or
        this one, never a part of it) and return its URI."""
        return self.write_many(asset_path, {partition: frame}, schema)[partition]

    def write_many(
        self,
        asset_path: Sequence[str],
        frames: Mapping[str | None, pd.DataFrame],
        schema: pa.Schema,
    ) -> dict[str | None, str]:
        """Store the frames of several partitions (a run of a range), each as `write` does,
        and return their URIs. Locally all or none: a run that fails at one file (a full
        disk) must not leave the files before it changed, holding frames no materialization
        records, so every file is written aside before any is renamed into place. On S3
        each object is whole, but a failure leaves the objects uploaded before it."""
        # Every frame checked against the declaration before anything is written.
        tables = {partition: frame_table(frame, schema) for partition, frame in frames.items()}
        paths = {partition: self.path(asset_path, partition) for partition in tables}
        if not isinstance(self.filesystem, pafs.LocalFileSystem):
            # An S3 object appears when its upload completes, whole or not at all.
            for partition, table in tables.items():
                pq.write_table(table, paths[partition], filesystem=self.filesystem)
            return {partition: self.scheme + path for partition, path in paths.items()}
        partials: dict[str | None, str] = {}
        try:
            for partition, table in tables.items():
                path = Path(paths[partition])
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = f"{path.parent}/.{path.name}.{uuid.uuid4().hex}.tmp"
                partials[partition] = partial
                pq.write_table(table, partial, filesystem=self.filesystem)
            for partition in tables:
                self.filesystem.move(partials.pop(partition), paths[partition])  # rename(2)
        finally:
            for partial in partials.values():
                if self.filesystem.get_file_info(partial).type != pafs.FileType.NotFound:
                    self.filesystem.delete_file(partial)
        return {partition: self.scheme + path for partition, path in paths.items()}

    def read(self, asset_path: Sequence[str], partition: str | None) -> pd.DataFrame:
        path = self.path(asset_path, partition)
        try:
            return pq.read_table(path, filesystem=self.filesystem).to_pandas()
        except FileNotFoundError:
            raise FrameMissing(self.scheme + path) from None


def build_frame_store(
    *, bucket: str | None, endpoint_url: str | None, region_name: str | None, home: Path
) -> FrameStore:
    """The results store's bucket when one is configured (PIN_S3_BUCKET, PIN_S3_ENDPOINT_URL,
    PIN_S3_REGION; credentials from the standard AWS chain), else `home`."""
    if bucket:
        filesystem = pafs.S3FileSystem(
            region=region_name,
            endpoint_override=endpoint_url,
            connect_timeout=S3_CONNECT_TIMEOUT_SECONDS,
            request_timeout=S3_REQUEST_TIMEOUT_SECONDS,
        )
        return FrameStore(filesystem, bucket, scheme="s3://")
    return FrameStore(pafs.LocalFileSystem(), str(home.resolve()))
