"""Analysts read assets, not tables: docs/analysts.md's snippets, run exactly as written in a
fresh shell that has only `eval "$(pin env)"`, against a materialized day of reconcile and a
recalculated project on an embedded stack, give the DataFrames they say. The derived
frames are Parquet in S3 or a directory, read by other processes and other tools."""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    Definitions,
    EvaluateAutomationConditionsResult,
    RunRequest,
    evaluate_automation_conditions,
)
from dagster._core.definitions.automation_tick_evaluation_context import (
    build_run_requests_with_backfill_policies,
)
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.storage.defs_state.base import _current_storage
from sqlalchemy import Engine, text

from pin_orchestration.analyst import (
    BUILDING_FREE_SHARE_SCHEMA,
    DRIFT_BY_STATUS_SCHEMA,
    SCRAPING_OUTCOMES_SCHEMA,
    building_free_share,
    drift_by_post_status,
    project_aggregates_frame,
    scraping_outcomes,
)
from pin_orchestration.assets.analyst import (
    BUILDING_FREE_SHARE,
    DRIFT_BY_POST_STATUS,
    SCRAPING_DAILY_OUTCOMES,
)
from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES
from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS
from pin_orchestration.chessboard.sample import WorldShape, generate_world
from pin_orchestration.definitions import build_definitions
from pin_orchestration.devstack.up import prepare_dagster_home
from pin_orchestration.migrations import upgrade_database
from pin_orchestration.platform.db import create_db_engine, dagster_storage_url
from pin_orchestration.platform.embedded import start_embedded_postgres, stop_embedded_postgres
from pin_orchestration.platform.frames import (
    FrameSchemaError,
    FrameStore,
    arrow_schema,
    frame_table,
)
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.analyst_io import (
    COLUMN_SCHEMA,
    FrameNotMaterialized,
    declared_arrow_schema,
)
from pin_orchestration.scraping.store.results import s3_client
from tests.chessboard.world import add_building, add_object, add_project, enqueue
from tests.conftest import embedded_data_dir
from tests.news_reconcile.factories import add_comments, add_post

ROOT = Path(__file__).resolve().parent.parent
DAY = "2026-11-29"


def add_scraping_job(engine: Engine, created_at: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    with engine.begin() as conn:
        tenant = conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix) "
                "VALUES (:id, :name, :sha, 'k') RETURNING id"
            ),
            {"id": uuid.uuid4(), "name": f"t{job_id.hex[:8]}", "sha": job_id.bytes},
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO scraping.jobs (id, tenant_id, url, domain, created_at) "
                "VALUES (:id, :tenant, 'https://example.org/a', 'example.org', :at)"
            ),
            {"id": job_id, "tenant": tenant, "at": created_at},
        )
    return job_id


def readme_blocks(section: str, language: str) -> list[str]:
    page = (ROOT / "docs" / "analysts.md").read_text()
    body = page.split(f"# {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.DOTALL)


def set_analyst_env(monkeypatch: pytest.MonkeyPatch, db_url: str, home: Path) -> Path:
    """The environment `pin up` gives its processes; returns DAGSTER_HOME."""
    dagster_home = prepare_dagster_home(
        Settings.from_env({"PIN_HOME": str(home)}), ROOT / "dagster.yaml"
    )
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    monkeypatch.setenv("PIN_HOME", str(home))
    monkeypatch.setenv("PIN_DAGSTER_PG_URL", dagster_storage_url(db_url))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    for name in ("PIN_S3_BUCKET", "PIN_S3_ENDPOINT_URL", "PIN_S3_REGION"):
        monkeypatch.delenv(name, raising=False)
    return dagster_home


def finalize_what_earlier_tests_left() -> None:
    """An instance entered and never exited by an earlier test in this worker (a suspended
    generator holding `with instance:`) resets Dagster's defs-state context variable when
    the collector finalizes it, to the storage it found there: one of an instance long
    gone. Collected during this test, that broke building the definitions ("Attempted to
    resolve undefined DagsterInstance weakref", seen once under load); collected here, it
    happens before this test sets its own."""
    gc.collect()
    _current_storage.set(None)


@pytest.fixture
def analyst_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DagsterInstance:
    """What `pin up` leaves an analyst: the database, PIN_HOME and a DAGSTER_HOME whose
    instance storage is the same PostgreSQL."""
    set_analyst_env(monkeypatch, db_url, tmp_path / "pin")
    finalize_what_earlier_tests_left()
    with DagsterInstance.get() as instance:
        yield instance


@pytest.fixture
def embedded_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Engine]]:
    """A checkout beside which the embedded default runs, as `./scripts/run` leaves it: a
    migrated embedded PostgreSQL under ./.pin and DAGSTER_HOME in it. Returns the checkout
    and the platform database; this process has the stack's environment."""
    with embedded_data_dir() as checkout:
        home = checkout / ".pin"
        url = start_embedded_postgres(home / "pgdata", stop_on_exit=True)
        try:
            upgrade_database(url)
            set_analyst_env(monkeypatch, url, home)
            finalize_what_earlier_tests_left()
            yield checkout, create_db_engine(url)
        finally:
            create_db_engine(url).dispose()
            stop_embedded_postgres(home / "pgdata")


def run_readme_in_fresh_shell(checkout: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """The section's shell block, then its Python blocks as one script, in a shell whose
    environment has only PATH (with `pin`) and HOME: all else comes from `pin env`."""
    script = checkout / "readme_snippets.py"
    script.write_text(
        "\n".join(readme_blocks("Reading the data", "python")) + "\nimport pickle, sys\n"
        "frames = {k: v for k, v in dict(globals()).items() if isinstance(v, pd.DataFrame)}\n"
        "pickle.dump(frames, open(sys.argv[1], 'wb'))\n"
    )
    (shell,) = readme_blocks("Reading the data", "bash")
    return subprocess.run(
        [
            "bash",
            "-c",
            f"set -e\n{shell}\npython {shlex.quote(str(script))} {shlex.quote(str(out))}",
        ],
        cwd=checkout,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(checkout)},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_readme_snippets_load_every_asset_as_a_dataframe_in_a_fresh_shell(
    embedded_stack: tuple[Path, Engine],
) -> None:
    checkout, db_engine = embedded_stack
    instance = DagsterInstance.get()
    drifted = add_post(db_engine, comments_count=5)
    add_comments(db_engine, drifted, 2)
    generate_world(db_engine, WorldShape(projects=1, objects=20), prefix="analyst")
    with db_engine.connect() as conn:
        project = str(conn.execute(text("SELECT id FROM chessboard.projects")).scalar_one())
    instance.add_dynamic_partitions("chessboard_projects", [project])
    scraped = add_scraping_job(db_engine, "2026-11-29T23:59:00Z")
    add_scraping_job(db_engine, "2026-11-30T00:00:00Z")  # the next UTC day

    defs = build_definitions()
    day = defs.resolve_implicit_global_asset_job_def()
    reconciled = day.execute_in_process(
        instance=instance,
        partition_key=DAY,
        asset_selection=[POST_COMMENT_COUNTS, DRIFT_BY_POST_STATUS],
        run_config={"ops": {"news__post_comment_counts": {"config": {"scope": "FullSweep"}}}},
    )
    assert reconciled.success
    recalculated = day.execute_in_process(
        instance=instance,
        partition_key=project,
        asset_selection=[PROJECT_AGGREGATES, BUILDING_FREE_SHARE],
    )
    assert recalculated.success
    # scraping/results is materialized by worker runs; its derived day here directly.
    scraping_day = day.execute_in_process(
        instance=instance, partition_key=DAY, asset_selection=[SCRAPING_DAILY_OUTCOMES]
    )
    assert scraping_day.success

    frames = checkout / "frames.pickle"
    shell = run_readme_in_fresh_shell(checkout, frames)
    assert shell.returncode == 0, shell.stderr[-4000:]
    namespace = pickle.loads(frames.read_bytes())

    runs = namespace["runs"]
    assert isinstance(runs, pd.DataFrame)
    assert list(runs[["posts_reconciled", "drift_corrected"]].iloc[0]) == [1, 1]
    corrections = namespace["corrections"]
    assert list(corrections[["from", "to"]].iloc[0]) == [5, 2]
    assert corrections["post_id"].iloc[0] == str(drifted)

    aggregates = namespace["aggregates"]
    levels = aggregates.groupby("level").size().to_dict()
    assert levels["project"] == 1 and levels["building"] >= 1 and levels["layout"] >= 1
    project_total = aggregates.loc[aggregates.level == "project", "total_count"].iloc[0]
    assert project_total > 0

    jobs = namespace["jobs"]
    assert list(jobs["job_id"]) == [scraped]
    assert {"tenant", "url", "status", "attempts", "result_key", "result_sha256"} <= set(
        jobs.columns
    )

    drift = namespace["drift"]
    assert drift.to_dict("records") == [
        {"post_status": "Published", "posts_corrected": 1, "comments_count_change": -3}
    ]
    free_share = namespace["free_share"]
    # The buildings' objects add up to the project's.
    assert free_share["total_count"].sum() == project_total
    assert free_share["free_share"].between(0, 1).all()
    outcomes = namespace["outcomes"]
    assert outcomes[["domain", "status", "jobs"]].to_dict("records") == [
        {"domain": "example.org", "status": "queued", "jobs": 1}
    ]
    # The same frame, read as a file by pandas and summed by DuckDB.
    assert namespace["day"].equals(outcomes)
    assert namespace["jobs_by_status"].to_dict("records") == [{"status": "queued", "jobs": 1}]
    assert not list((checkout / ".pin").rglob("*.pkl"))


def test_derived_assets_follow_their_upstream_in_the_graph() -> None:
    graph = build_definitions().resolve_asset_graph()
    assert graph.get(DRIFT_BY_POST_STATUS).parent_keys == {POST_COMMENT_COUNTS}
    assert graph.get(BUILDING_FREE_SHARE).parent_keys == {PROJECT_AGGREGATES}
    assert graph.get(SCRAPING_DAILY_OUTCOMES).parent_keys == {AssetKey(["scraping", "results"])}
    for key in (DRIFT_BY_POST_STATUS, BUILDING_FREE_SHARE, SCRAPING_DAILY_OUTCOMES):
        assert graph.get(key).automation_condition is not None, key
    assert AssetKey(["scraping", "results"]) in graph.get_all_asset_keys()


# Another process, reading the frame first as a plain Parquet object (pyarrow's own S3
# client, none of this package), then as the asset through this package's IO manager.
READ_IN_ANOTHER_PROCESS = """
import json, os, sys
import pyarrow.fs, pyarrow.parquet
s3 = pyarrow.fs.S3FileSystem(endpoint_override=os.environ["PIN_S3_ENDPOINT_URL"])
plain = pyarrow.parquet.read_table(sys.argv[1], filesystem=s3).to_pandas()
from pin_orchestration.definitions import build_definitions
loaded = build_definitions().load_asset_value(
    ["scraping", "daily_outcomes"], partition_key=sys.argv[2]
)
columns = ["tenant", "domain", "status", "jobs", "attempts"]
print(json.dumps({name: frame[columns].to_dict("records") for name, frame in
                  (("plain", plain), ("loaded", loaded))}))
"""


def test_a_derived_frame_written_to_s3_is_read_by_another_process(
    analyst_env: DagsterInstance,
    db_engine: Engine,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = f"results-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    monkeypatch.setenv("PIN_S3_BUCKET", bucket)
    monkeypatch.setenv("PIN_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("PIN_S3_REGION", "us-east-1")
    add_scraping_job(db_engine, "2026-11-29T12:00:00Z")
    job = build_definitions().resolve_implicit_global_asset_job_def()
    written = job.execute_in_process(
        instance=analyst_env, partition_key=DAY, asset_selection=[SCRAPING_DAILY_OUTCOMES]
    )
    assert written.success
    (materialization,) = written.asset_materializations_for_node("scraping__daily_outcomes")
    key = f"{bucket}/assets/scraping/daily_outcomes/{DAY}.parquet"
    assert materialization.metadata["path"].value == f"s3://{key}"
    assert not (Path(os.environ["PIN_HOME"]) / "assets").exists()

    reader = subprocess.run(
        [sys.executable, "-c", READ_IN_ANOTHER_PROCESS, key, DAY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reader.returncode == 0, reader.stderr[-4000:]
    read = json.loads(reader.stdout.strip().splitlines()[-1])
    tenant = pd.read_sql("SELECT name FROM scraping.tenants", db_engine)["name"].iloc[0]
    expected = [
        {"tenant": tenant, "domain": "example.org", "status": "queued", "jobs": 1, "attempts": 0}
    ]
    assert read == {"plain": expected, "loaded": expected}


def test_a_frame_never_materialized_names_the_asset_partition_and_the_command(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    add_scraping_job(db_engine, "2026-11-29T12:00:00Z")
    defs = build_definitions()
    with pytest.raises(FrameNotMaterialized) as missing:
        defs.load_asset_value(
            ["scraping", "daily_outcomes"], partition_key=DAY, instance=analyst_env
        )
    message = str(missing.value)
    assert f"partition '{DAY}' of scraping/daily_outcomes is not materialized yet" in message
    command = re.search(r"`(dagster asset materialize [^`]+)`", message)
    assert command is not None, message

    # The command it names, run as an operator would (the venv's bin on PATH), stores it.
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    ran = subprocess.run(
        shlex.split(command.group(1)),
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    outcomes = defs.load_asset_value(
        ["scraping", "daily_outcomes"], partition_key=DAY, instance=analyst_env
    )
    assert outcomes[["domain", "jobs"]].to_dict("records") == [{"domain": "example.org", "jobs": 1}]


EMPTY_DAY = "2026-11-28"


def test_every_day_of_a_frame_reads_as_one_table_an_empty_day_included(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    """Most days have no drift: docs/analysts.md's folder reads (pandas, DuckDB's glob) must
    take an empty day beside a day with rows."""
    job = build_definitions().resolve_implicit_global_asset_job_def()
    reconcile = {"ops": {"news__post_comment_counts": {"config": {"scope": "FullSweep"}}}}
    for day in (EMPTY_DAY, DAY):
        if day == DAY:
            drifted = add_post(db_engine, comments_count=5)
            add_comments(db_engine, drifted, 2)
            add_scraping_job(db_engine, "2026-11-29T12:00:00Z")
        news = job.execute_in_process(
            instance=analyst_env,
            partition_key=day,
            asset_selection=[POST_COMMENT_COUNTS, DRIFT_BY_POST_STATUS],
            run_config=reconcile,
        )
        scraping = job.execute_in_process(
            instance=analyst_env, partition_key=day, asset_selection=[SCRAPING_DAILY_OUTCOMES]
        )
        assert news.success and scraping.success

    (block,) = readme_blocks("Every day at once", "python")
    namespace: dict[str, object] = {}
    exec(block, namespace)

    every_day = namespace["every_day"]
    assert every_day.to_dict("records") == [
        {"post_status": "Published", "posts_corrected": 1, "comments_count_change": -3}
    ]
    assert namespace["drift_by_day"].to_dict("records") == [
        {"day": DAY, "post_status": "Published", "posts_corrected": 1, "comments_count_change": -3}
    ]
    # The empty day is read (it comes first in the glob) and has no rows to group.
    assert namespace["jobs_by_day"].to_dict("records") == [{"day": DAY, "jobs": 1}]


def _empty_frames() -> dict[AssetKey, pd.DataFrame]:
    """Each derived frame of a partition with nothing in it."""
    return {
        DRIFT_BY_POST_STATUS: drift_by_post_status(
            None,  # type: ignore[arg-type]  # no run: nothing is read
            pd.DataFrame({"run_id": []}),
            "2026-01-01",
        ),
        BUILDING_FREE_SHARE: building_free_share(
            pd.DataFrame(columns=["level", "id", "name", "total_count", "free_count"])
        ),
        SCRAPING_DAILY_OUTCOMES: scraping_outcomes(pd.DataFrame()),
    }


DECLARED = {
    DRIFT_BY_POST_STATUS: DRIFT_BY_STATUS_SCHEMA,
    BUILDING_FREE_SHARE: BUILDING_FREE_SHARE_SCHEMA,
    SCRAPING_DAILY_OUTCOMES: SCRAPING_OUTCOMES_SCHEMA,
}


def test_each_derived_asset_shows_its_columns_and_every_file_has_them(tmp_path: Path) -> None:
    graph = build_definitions().resolve_asset_graph()
    store = FrameStore(pafs.LocalFileSystem(), str(tmp_path))
    for key, empty in _empty_frames().items():
        declared = [(c.name, c.type, c.description) for c in DECLARED[key]]
        shown = graph.get(key).metadata[COLUMN_SCHEMA]
        assert [(c.name, c.type, c.description) for c in shown.columns] == declared, key
        schema = declared_arrow_schema(key.to_user_string(), graph.get(key).metadata)
        written = store.write(key.path, "empty", empty, schema)
        assert pq.read_schema(written).remove_metadata() == arrow_schema(
            (name, type_name) for name, type_name, _ in declared
        ), key


def test_a_frame_unlike_its_declaration_is_refused_naming_the_columns(tmp_path: Path) -> None:
    store = FrameStore(pafs.LocalFileSystem(), str(tmp_path))
    schema = arrow_schema([("status", "string"), ("jobs", "int64")])
    with pytest.raises(FrameSchemaError, match=r"\['jobs', 'status'\] are not the declared"):
        store.write(["scraping", "x"], "day", pd.DataFrame({"jobs": [1], "status": ["q"]}), schema)
    assert not list(tmp_path.rglob("*.parquet"))


def test_docs_list_each_frames_columns_as_declared() -> None:
    page = (ROOT / "docs" / "analysts.md").read_text()
    for key, columns in DECLARED.items():
        section = page.split(f"### {key.to_user_string()}\n", 1)[1].split("\n#", 1)[0]
        rows = re.findall(r"^\| `(\w+)` \| (\w+) \| (.+) \|$", section, flags=re.MULTILINE)
        assert rows == [(c.name, c.type, c.description) for c in columns], key


def test_automation_builds_no_frame_on_a_partition_that_failed_its_check(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    """chessboard/building_free_share reads a project's stored aggregates: after the
    divergence check found them false, automation must not publish a frame from them."""
    with db_engine.begin() as conn:
        diverged, sound = add_project(conn), add_project(conn)
        for project in (diverged, sound):
            add_object(conn, project, status="Free", building_id=add_building(conn, project))
    partitions = [str(diverged), str(sound)]
    analyst_env.add_dynamic_partitions("chessboard_projects", partitions)
    defs = build_definitions()
    frames_only = AssetSelection.assets(BUILDING_FREE_SHARE)
    # The automation sensor's previous tick: what happens next is news to it.
    before = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only
    )
    for project in partitions:
        recalculated = defs.resolve_implicit_global_asset_job_def().execute_in_process(
            instance=analyst_env, partition_key=project, asset_selection=[PROJECT_AGGREGATES]
        )
        assert recalculated.success
    with db_engine.begin() as conn:
        conn.execute(
            text("UPDATE chessboard.projects SET property_objects_free_count = 7 WHERE id = :p"),
            {"p": diverged},
        )
    checked = defs.resolve_job_def("chessboard_divergence_check").execute_in_process(
        instance=analyst_env,
        run_config={"ops": {"check_project_divergence": {"config": {"project_ids": partitions}}}},
    )
    assert [e.passed for e in checked.get_asset_check_evaluations()] == [False, True]

    evaluated = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only, cursor=before.cursor
    )
    requested = evaluated.get_requested_partitions(BUILDING_FREE_SHARE)
    assert requested == {str(sound)}

    # The fix (a recalc, here forced from the UI) is a new materialization: the frame follows.
    fixed = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=analyst_env, partition_key=str(diverged), asset_selection=[PROJECT_AGGREGATES]
    )
    assert fixed.success
    after_fix = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only, cursor=evaluated.cursor
    )
    assert after_fix.get_requested_partitions(BUILDING_FREE_SHARE) == {str(diverged)}


def projects_with_buildings(engine: Engine, n: int) -> list[uuid.UUID]:
    """`n` projects of one to three buildings, each with a different mix of free objects."""
    projects = []
    with engine.begin() as conn:
        for i in range(n):
            project = add_project(conn)
            for b in range(1 + i % 3):
                building = add_building(conn, project)
                for status in ["Free"] * (i + b) + ["Sold"] * (b + 1):
                    add_object(conn, project, status=status, building_id=building)
            projects.append(project)
    return projects


def drain_due(
    defs: Definitions, instance: DagsterInstance, engine: Engine, projects: list[uuid.UUID]
) -> None:
    """A drain run recalculates `projects`, their requests raised long enough ago to be due."""
    raised = datetime.now(UTC) - timedelta(minutes=5)
    for project in projects:
        enqueue(engine, project, at=raised)
    drained = defs.resolve_job_def("chessboard_project_recalc_drain").execute_in_process(
        instance=instance
    )
    assert drained.success
    recalculated = instance.fetch_materializations(
        AssetRecordsFilter(
            asset_key=PROJECT_AGGREGATES, asset_partitions=[str(p) for p in projects]
        ),
        limit=len(projects) + 1,
    ).records
    assert {r.partition_key for r in recalculated} == {str(p) for p in projects}


def automation_runs(
    defs: Definitions, instance: DagsterInstance, evaluated: EvaluateAutomationConditionsResult
) -> list[RunRequest]:
    """The runs `pin_analyst_automation` has launched for an evaluation of the frame: more than
    one partition is requested as a backfill (the sensor's emit_backfills), whose runs the
    backfill daemon builds with this function of Dagster's by the asset's backfill policy."""
    requested = [
        AssetKeyPartitionKey(BUILDING_FREE_SHARE, partition)
        for partition in sorted(evaluated.get_requested_partitions(BUILDING_FREE_SHARE))
    ]
    with partition_loading_context(dynamic_partitions_store=instance):
        return list(
            build_run_requests_with_backfill_policies(
                requested, defs.resolve_asset_graph(), instance
            )
        )


def execute_requests(
    defs: Definitions, instance: DagsterInstance, requests: list[RunRequest]
) -> None:
    job = defs.resolve_implicit_global_asset_job_def()
    for request in requests:
        run = job.execute_in_process(
            instance=instance,
            asset_selection=list(request.asset_selection),
            partition_key=request.partition_key,
            tags=request.tags,
        )
        assert run.success


def frame_file(home: Path, project: uuid.UUID) -> Path:
    return home / "assets" / "chessboard" / "building_free_share" / f"{project}.parquet"


def test_a_drains_recalculated_projects_get_their_frames_in_one_run(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    """One Dagster run costs seconds of CPU: a drain that recalculated N projects must not
    make automation launch N runs of chessboard/building_free_share."""
    defs = build_definitions()
    projects = projects_with_buildings(db_engine, 4)
    frames_only = AssetSelection.assets(BUILDING_FREE_SHARE)
    before = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only
    )
    drain_due(defs, analyst_env, db_engine, projects)
    evaluated = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only, cursor=before.cursor
    )
    assert evaluated.get_requested_partitions(BUILDING_FREE_SHARE) == {str(p) for p in projects}

    runs_before = analyst_env.get_runs_count()
    execute_requests(defs, analyst_env, automation_runs(defs, analyst_env, evaluated))
    assert analyst_env.get_runs_count() - runs_before == 1

    home = Path(os.environ["PIN_HOME"])
    schema = arrow_schema((c.name, c.type) for c in BUILDING_FREE_SHARE_SCHEMA)
    for project in projects:
        # The project's frame as the Parquet file holds it (its declared column types).
        expected = frame_table(
            building_free_share(project_aggregates_frame(db_engine, project)), schema
        ).to_pandas()
        loaded = defs.load_asset_value(
            BUILDING_FREE_SHARE, partition_key=str(project), instance=analyst_env
        )
        pd.testing.assert_frame_equal(loaded, expected)
        # Each partition is materialized with its own rows and file, as a run of it alone.
        (record,) = analyst_env.fetch_materializations(
            AssetRecordsFilter(asset_key=BUILDING_FREE_SHARE, asset_partitions=[str(project)]),
            limit=5,
        ).records
        metadata = record.asset_materialization.metadata
        assert metadata["rows"].value == len(expected) > 0
        assert metadata["path"].value == str(frame_file(home.resolve(), project))


def test_a_frame_written_in_a_run_of_several_projects_is_the_frame_of_a_run_of_one(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    """Analysts read one project's file: a run of many writes exactly the bytes (and logs the
    metadata) a run of that project alone does."""
    defs = build_definitions()
    projects = projects_with_buildings(db_engine, 3)
    drain_due(defs, analyst_env, db_engine, projects)
    job = defs.resolve_implicit_global_asset_job_def()
    home = Path(os.environ["PIN_HOME"]).resolve()

    alone = {}
    for project in projects:
        run = job.execute_in_process(
            instance=analyst_env, partition_key=str(project), asset_selection=[BUILDING_FREE_SHARE]
        )
        (materialization,) = run.asset_materializations_for_node("chessboard__building_free_share")
        alone[project] = (
            frame_file(home, project).read_bytes(),
            defs.load_asset_value(
                BUILDING_FREE_SHARE, partition_key=str(project), instance=analyst_env
            ),
            {k: v.value for k, v in materialization.metadata.items()},
        )
        frame_file(home, project).unlink()

    registered = analyst_env.get_dynamic_partitions("chessboard_projects")
    assert sorted(registered) == sorted(str(p) for p in projects)
    together = job.execute_in_process(
        instance=analyst_env,
        asset_selection=[BUILDING_FREE_SHARE],
        # The drain registered the projects, in the order it took them: the range is all three.
        tags={
            "dagster/asset_partition_range_start": registered[0],
            "dagster/asset_partition_range_end": registered[-1],
        },
    )
    assert together.success
    logged = {
        m.partition: {k: v.value for k, v in m.metadata.items()}
        for m in together.asset_materializations_for_node("chessboard__building_free_share")
    }
    assert set(logged) == {str(p) for p in projects}
    for project in projects:
        data, frame, metadata = alone[project]
        assert frame_file(home, project).read_bytes() == data
        assert defs.load_asset_value(
            BUILDING_FREE_SHARE, partition_key=str(project), instance=analyst_env
        ).equals(frame)
        assert logged[str(project)] == metadata


def test_projects_apart_in_the_partitions_order_get_a_run_per_stretch(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    """What the single-run policy cannot do in Dagster 1.13: a run materializes a range of
    partition keys (their order: when each project was first registered), so a drain of
    projects registered apart launches one run per stretch of adjacent ones (dagster-io/dagster
    issue 32335). The first drain of new projects, as the demo's, is one stretch."""
    defs = build_definitions()
    a, b, c, d = projects_with_buildings(db_engine, 4)
    analyst_env.add_dynamic_partitions("chessboard_projects", [str(p) for p in (a, b, c, d)])
    frames_only = AssetSelection.assets(BUILDING_FREE_SHARE)
    before = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only
    )
    drain_due(defs, analyst_env, db_engine, [a, b, d])
    evaluated = evaluate_automation_conditions(
        defs=defs, instance=analyst_env, asset_selection=frames_only, cursor=before.cursor
    )
    ranges = sorted(
        (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
        for r in automation_runs(defs, analyst_env, evaluated)
    )
    assert ranges == sorted([(str(a), str(b)), (str(d), str(d))])
