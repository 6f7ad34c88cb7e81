"""chessboard/building_free_share against generated source rows: whatever buildings,
statuses and deletions a project has, the frame's counts per building are what the
property objects say (AGG-4: total = not deleted and not Hidden; free = not deleted and
Free), after a real recalc and a real materialization of both assets."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from pin_orchestration.assets.analyst import BUILDING_FREE_SHARE
from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES
from pin_orchestration.definitions import build_definitions
from tests.chessboard.world import add_building, add_object, add_project

STATUSES = ("Free", "Booked", "Sold", "Hidden")


@dataclass(frozen=True)
class GeneratedObject:
    building: int | None  # index into the project's buildings; None: no building
    status: str
    deleted: bool


def objects(buildings: int) -> st.SearchStrategy[list[GeneratedObject]]:
    return st.lists(
        st.builds(
            GeneratedObject,
            building=st.one_of(st.none(), st.integers(0, buildings - 1)),
            status=st.sampled_from(STATUSES),
            deleted=st.booleans(),
        ),
        max_size=12,
    )


projects = st.integers(1, 3).flatmap(lambda n: st.tuples(st.just(n), objects(n)))


def expected_counts(buildings: list[uuid.UUID], rows: list[GeneratedObject]) -> pd.DataFrame:
    counts = {b: [0, 0] for b in buildings}
    for row in rows:
        if row.building is None or row.deleted:
            continue
        building = buildings[row.building]
        counts[building][0] += row.status != "Hidden"
        counts[building][1] += row.status == "Free"
    return pd.DataFrame(
        [(str(b), total, free) for b, (total, free) in counts.items()],
        columns=["building_id", "total_count", "free_count"],
    )


@pytest.fixture
def frames_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    monkeypatch.setenv("PIN_HOME", str(tmp_path))
    for name in ("PIN_S3_BUCKET", "PIN_S3_ENDPOINT_URL", "PIN_S3_REGION"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@seed(20261203)
@settings(
    max_examples=5,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(project=projects)
def test_the_free_share_frame_counts_what_the_source_rows_say(
    frames_env: Path, db_engine: Engine, project: tuple[int, list[GeneratedObject]]
) -> None:
    building_count, rows = project
    with db_engine.begin() as conn:
        project_id = add_project(conn, property_objects_free_count=99)  # stale until recalc
        buildings = [add_building(conn, project_id) for _ in range(building_count)]
        for row in rows:
            add_object(
                conn,
                project_id,
                status=row.status,
                building_id=None if row.building is None else buildings[row.building],
                deleted=row.deleted,
            )
    defs = build_definitions()
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("chessboard_projects", [str(project_id)])
        run = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=instance,
            partition_key=str(project_id),
            asset_selection=[PROJECT_AGGREGATES, BUILDING_FREE_SHARE],
        )
        assert run.success
        frame = defs.load_asset_value(
            BUILDING_FREE_SHARE, partition_key=str(project_id), instance=instance
        )

    got = frame.sort_values("building_id").reset_index(drop=True)
    want = expected_counts(buildings, rows).sort_values("building_id").reset_index(drop=True)
    assert (
        got[["building_id", "total_count", "free_count"]].astype(object).equals(want.astype(object))
    ), (got, want)
    for total, free, share in got[["total_count", "free_count", "free_share"]].itertuples(
        index=False
    ):
        assert pd.isna(share) if total == 0 else share == free / total
