"""IO managers that let analysts `defs.load_asset_value(key, partition_key=...)` every asset
as a pandas DataFrame.

The jobs' own assets live in PostgreSQL tables the jobs keep: `PostgresAssetReader` reads
a partition's value from them on load and stores nothing on materialization (the
materialization already wrote the tables). The analysts' derived assets are computed
frames: `PickledFrameStore` keeps one pickle per partition under $PIN_HOME/assets.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd
from dagster import ConfigurableIOManager, InputContext, OutputContext
from pydantic import Field

from pin_orchestration.analyst import (
    project_aggregates_frame,
    reconcile_runs_frame,
    scraping_results_frame,
)
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.settings import Settings


class PostgresAssetReader(ConfigurableIOManager):
    """Values of news/post_comment_counts, chessboard/project_aggregates and
    scraping/results, read from PostgreSQL per partition (day; project id; UTC day)."""

    database: DatabaseResource = Field(default_factory=DatabaseResource)

    def handle_output(self, context: OutputContext, obj: object) -> None:
        """Nothing to store: the run wrote the tables this manager reads."""

    def load_input(self, context: InputContext) -> pd.DataFrame:
        # Imported here: the asset modules bundle this manager (io_manager_def).
        from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES, project_id_of
        from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS
        from pin_orchestration.assets.scraping import SCRAPING_RESULTS

        key = context.asset_key
        engine = self.database.get_engine()
        if key == POST_COMMENT_COUNTS:
            return reconcile_runs_frame(engine, context.asset_partition_key)
        if key == PROJECT_AGGREGATES:
            return project_aggregates_frame(engine, project_id_of(context.asset_partition_key))
        if key == SCRAPING_RESULTS:
            return scraping_results_frame(engine, context.asset_partition_key)
        raise ValueError(f"PostgresAssetReader cannot load {key.to_user_string()}")


class PickledFrameStore(ConfigurableIOManager):
    """Derived DataFrames, one file per asset partition under `base_dir`."""

    base_dir: str | None = Field(
        default=None, description="Where the frames live; empty for $PIN_HOME/assets"
    )

    def _path(self, context: InputContext | OutputContext) -> Path:
        base = Path(self.base_dir) if self.base_dir else Settings.from_env().home / "assets"
        name = context.asset_partition_key if context.has_asset_partitions else "all"
        return base.joinpath(*context.asset_key.path) / f"{name}.pkl"

    def handle_output(self, context: OutputContext, obj: pd.DataFrame) -> None:
        path = self._path(context)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.write_bytes(pickle.dumps(obj))
        partial.replace(path)  # a reader never sees half a frame
        context.add_output_metadata({"rows": len(obj), "path": str(path)})

    def load_input(self, context: InputContext) -> pd.DataFrame:
        return pickle.loads(self._path(context).read_bytes())
