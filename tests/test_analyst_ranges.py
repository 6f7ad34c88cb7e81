"""chessboard/building_free_share in runs of a range of projects (BackfillPolicy.single_run)
against generated projects: a project with no building, buildings of no objects (a null
share), names no file system or Parquet writer is used to, and projects removed since
they were registered. Each project's file, loaded frame and materialization metadata from
the run of the range must be those of a run of that project alone."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterInstance, Definitions
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from pin_orchestration.assets.analyst import BUILDING_FREE_SHARE
from pin_orchestration.definitions import build_definitions
from tests.chessboard.world import add_building, add_project
from tests.test_analyst import analyst_env, frame_file

__all__ = ["analyst_env"]  # the fixture, used by name

NODE = "chessboard__building_free_share"


@dataclass(frozen=True)
class Building:
    name: str | None
    total: int
    free: int


@dataclass(frozen=True)
class Project:
    buildings: tuple[Building, ...]
    removed: bool


# Names as a CRUD client may send them: none, empty, quotes, NUL-free unicode, long.
names = st.none() | st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=300,
)
buildings = st.integers(0, 6).flatmap(
    lambda total: st.builds(Building, name=names, total=st.just(total), free=st.integers(0, total))
)
projects = st.builds(
    Project, buildings=st.lists(buildings, max_size=4).map(tuple), removed=st.booleans()
)


def insert(engine: Engine, project: Project) -> uuid.UUID:
    with engine.begin() as conn:
        project_id = add_project(conn)
        for building in project.buildings:
            building_id = add_building(conn, project_id)
            conn.execute(
                text(
                    "UPDATE chessboard.buildings SET name = :name, "
                    "property_objects_total_count = :total, "
                    "property_objects_free_count = :free WHERE id = :id"
                ),
                {"id": building_id, **vars(building)},
            )
    return project_id


def remove(engine: Engine, project_id: uuid.UUID) -> None:
    """The project gone from the tables; its partition stays registered."""
    with engine.begin() as conn:
        for table in ("buildings", "layouts", "layout_groups", "property_objects"):
            conn.execute(
                text(f"DELETE FROM chessboard.{table} WHERE project_id = :p"), {"p": project_id}
            )
        conn.execute(text("DELETE FROM chessboard.projects WHERE id = :p"), {"p": project_id})


def metadata_of(materialization: object) -> dict[str, object]:
    return {k: v.value for k, v in materialization.metadata.items()}  # type: ignore[attr-defined]


def run_alone(
    defs: Definitions, instance: DagsterInstance, home: Path, project: uuid.UUID
) -> tuple[bytes, dict[str, object]]:
    job = defs.resolve_implicit_global_asset_job_def()
    run = job.execute_in_process(
        instance=instance, partition_key=str(project), asset_selection=[BUILDING_FREE_SHARE]
    )
    (materialization,) = run.asset_materializations_for_node(NODE)
    data = frame_file(home, project).read_bytes()
    frame_file(home, project).unlink()
    return data, metadata_of(materialization)


@seed(20261204)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(generated=st.lists(projects, min_size=2, max_size=4))
def test_a_range_s_files_and_metadata_are_those_of_runs_of_one(
    analyst_env: DagsterInstance, db_engine: Engine, generated: list[Project]
) -> None:
    defs = build_definitions()
    home = Path(os.environ["PIN_HOME"]).resolve()
    ids = [insert(db_engine, project) for project in generated]
    analyst_env.add_dynamic_partitions("chessboard_projects", [str(p) for p in ids])
    for project_id, project in zip(ids, generated, strict=True):
        if project.removed:
            remove(db_engine, project_id)

    alone = {p: run_alone(defs, analyst_env, home, p) for p in ids}

    together = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=analyst_env,
        asset_selection=[BUILDING_FREE_SHARE],
        tags={
            "dagster/asset_partition_range_start": str(ids[0]),
            "dagster/asset_partition_range_end": str(ids[-1]),
        },
    )
    assert together.success
    logged = {m.partition: metadata_of(m) for m in together.asset_materializations_for_node(NODE)}
    assert set(logged) == {str(p) for p in ids}
    for project_id in ids:
        data, metadata = alone[project_id]
        assert frame_file(home, project_id).read_bytes() == data, generated
        assert logged[str(project_id)] == metadata


def test_a_range_that_fails_to_store_one_frame_changes_no_file_of_it(
    analyst_env: DagsterInstance, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of one project that failed left its file as it was; a run of a range that fails
    (a full disk at its second file) must not leave the files it wrote before: they would
    hold frames no materialization records (an analyst loads a frame Dagster says was never
    built, or one newer than its last materialization), and no temporary files behind."""
    defs = build_definitions()
    home = Path(os.environ["PIN_HOME"]).resolve()
    before = Project(buildings=(Building("a", 4, 1),), removed=False)
    ids = [insert(db_engine, before) for _ in range(3)]
    analyst_env.add_dynamic_partitions("chessboard_projects", [str(p) for p in ids])
    job = defs.resolve_implicit_global_asset_job_def()
    range_tags = {
        "dagster/asset_partition_range_start": str(ids[0]),
        "dagster/asset_partition_range_end": str(ids[-1]),
    }
    assert job.execute_in_process(
        instance=analyst_env, asset_selection=[BUILDING_FREE_SHARE], tags=range_tags
    ).success
    stored = {p: frame_file(home, p).read_bytes() for p in ids}
    with db_engine.begin() as conn:
        conn.execute(text("UPDATE chessboard.buildings SET property_objects_free_count = 3"))

    import pyarrow.parquet as pq

    from pin_orchestration.platform import frames

    real_write = pq.write_table
    writes = 0

    def full_disk_at_the_second(*args: object, **kwargs: object) -> None:
        nonlocal writes
        writes += 1
        if writes == 2:
            raise OSError(28, "No space left on device")
        real_write(*args, **kwargs)

    monkeypatch.setattr(frames.pq, "write_table", full_disk_at_the_second)
    failed = job.execute_in_process(
        instance=analyst_env,
        asset_selection=[BUILDING_FREE_SHARE],
        tags=range_tags,
        raise_on_error=False,
    )
    assert not failed.success
    folder = frame_file(home, ids[0]).parent
    assert sorted(f.name for f in folder.iterdir()) == sorted(f"{p}.parquet" for p in ids)
    assert {p: frame_file(home, p).read_bytes() for p in ids} == stored

    monkeypatch.setattr(frames.pq, "write_table", real_write)  # the retry
    assert job.execute_in_process(
        instance=analyst_env, asset_selection=[BUILDING_FREE_SHARE], tags=range_tags
    ).success
    assert all(frame_file(home, p).read_bytes() != stored[p] for p in ids)


def test_a_reader_of_the_folder_during_a_range_s_write_reads_whole_files_of_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An analyst's `pandas.read_parquet(folder)` while a run of a range writes: the files
    written aside (dot-names, which pyarrow's discovery skips) are not read, and until the
    last is written none of the partitions has changed."""
    import pandas as pd
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from pin_orchestration.analyst import BUILDING_FREE_SHARE_SCHEMA
    from pin_orchestration.platform import frames

    schema = frames.arrow_schema((c.name, c.type) for c in BUILDING_FREE_SHARE_SCHEMA)
    store = frames.FrameStore(pafs.LocalFileSystem(), str(tmp_path))
    asset = ["chessboard", "building_free_share"]

    def version(free: int) -> dict[str | None, pd.DataFrame]:
        return {
            str(uuid.UUID(int=n)): pd.DataFrame(
                {
                    "building_id": [f"b{n}"],
                    "name": ["x"],
                    "total_count": [4],
                    "free_count": [free],
                    "free_share": [free / 4],
                }
            )
            for n in range(3)
        }

    store.write_many(asset, version(1), schema)
    folder = Path(store.path(asset, "x")).parent
    real_write = pq.write_table
    seen: list[pd.DataFrame] = []

    def write_then_read(table: object, where: str, **kwargs: object) -> None:
        real_write(table, where, **kwargs)
        seen.append(pd.read_parquet(folder))

    monkeypatch.setattr(frames.pq, "write_table", write_then_read)
    store.write_many(asset, version(3), schema)
    assert len(seen) == 3
    assert all(sorted(frame["free_count"]) == [1, 1, 1] for frame in seen)
    assert sorted(pd.read_parquet(folder)["free_count"]) == [3, 3, 3]
