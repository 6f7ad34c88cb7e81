"""The analysts' derived DataFrames as Parquet files, where any tool can read them.

One file per asset partition, `assets/<asset key path>/<partition>.parquet`, in the results
store's S3 bucket (PIN_S3_BUCKET) or, without one, under $PIN_HOME. pyarrow writes them
(its own S3 client, so no second botocore to keep in step with boto3's); pyarrow,
`pandas.read_parquet` and DuckDB read them without this package. No Dagster here: the IO
manager in `pin_orchestration.resources.analyst_io` calls this.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
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

    def write(self, asset_path: Sequence[str], partition: str | None, frame: pd.DataFrame) -> str:
        """Store `frame` whole (a reader sees the previous frame or this one, never a part
        of it) and return its URI."""
        path = self.path(asset_path, partition)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            partial = f"{Path(path).parent}/.{Path(path).name}.{uuid.uuid4().hex}.tmp"
            try:
                pq.write_table(table, partial, filesystem=self.filesystem)
                self.filesystem.move(partial, path)  # rename(2): atomic
            finally:
                if self.filesystem.get_file_info(partial).type != pafs.FileType.NotFound:
                    self.filesystem.delete_file(partial)
        else:
            # An S3 object appears when its upload completes, whole or not at all.
            pq.write_table(table, path, filesystem=self.filesystem)
        return self.scheme + path

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
