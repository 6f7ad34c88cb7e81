"""Analysts read assets, not tables: the README's snippets, run exactly as written against
a materialized day of reconcile and a recalculated project, give the DataFrames they say."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pandas as pd
import pytest
from dagster import AssetKey, DagsterInstance
from sqlalchemy import Engine, text

from pin_orchestration.assets.analyst import (
    BUILDING_FREE_SHARE,
    DRIFT_BY_POST_STATUS,
    SCRAPING_DAILY_OUTCOMES,
)
from pin_orchestration.assets.chessboard import PROJECT_AGGREGATES
from pin_orchestration.assets.news_reconcile import POST_COMMENT_COUNTS
from pin_orchestration.chessboard.sample import WorldShape, generate_world
from pin_orchestration.db import dagster_storage_url
from pin_orchestration.definitions import build_definitions
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


def readme_python_blocks(section: str) -> list[str]:
    readme = (ROOT / "README.md").read_text()
    body = readme.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.DOTALL)


@pytest.fixture
def analyst_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DagsterInstance:
    """What `pin up` leaves an analyst: the database, PIN_HOME and a DAGSTER_HOME whose
    instance storage is the same PostgreSQL."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("PIN_DATABASE_URL", db_url)
    monkeypatch.setenv("PIN_HOME", str(tmp_path / "pin"))
    monkeypatch.setenv("PIN_DAGSTER_PG_URL", dagster_storage_url(db_url))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with DagsterInstance.get() as instance:
        yield instance


def test_readme_snippets_load_every_asset_as_a_dataframe(
    analyst_env: DagsterInstance, db_engine: Engine
) -> None:
    instance = analyst_env
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

    namespace: dict[str, object] = {}
    for block in readme_python_blocks("Reading the data"):
        exec(compile(block, "README.md", "exec"), namespace)

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


def test_derived_assets_follow_their_upstream_in_the_graph() -> None:
    graph = build_definitions().resolve_asset_graph()
    assert graph.get(DRIFT_BY_POST_STATUS).parent_keys == {POST_COMMENT_COUNTS}
    assert graph.get(BUILDING_FREE_SHARE).parent_keys == {PROJECT_AGGREGATES}
    assert graph.get(SCRAPING_DAILY_OUTCOMES).parent_keys == {AssetKey(["scraping", "results"])}
    for key in (DRIFT_BY_POST_STATUS, BUILDING_FREE_SHARE, SCRAPING_DAILY_OUTCOMES):
        assert graph.get(key).automation_condition is not None, key
    assert AssetKey(["scraping", "results"]) in graph.get_all_asset_keys()
