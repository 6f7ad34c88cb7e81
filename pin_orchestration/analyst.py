"""Asset values as pandas DataFrames, read from the tables the jobs keep (no Dagster here:
the IO managers in `pin_orchestration.resources.analyst_io` call these), and the
analysts' derived tables computed from them."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pandas as pd
from sqlalchemy import Engine, TextClause, text

from pin_orchestration.news.reconcile import JOB_CODE as RECONCILE_JOB_CODE
from pin_orchestration.platform.frames import FrameColumn
from pin_orchestration.platform.sql import load_queries

RECONCILE_COLUMNS = [
    "run_id",
    "status",
    "started_at",
    "finished_at",
    "scope",
    "posts_reconciled",
    "drift_corrected",
    "corrections",
]

# The derived frames' columns, declared once: the assets show them in the UI
# (dagster/column_schema), every Parquet file of the asset is written with them, and
# docs/analysts.md lists them (tests/test_analyst.py holds the page to these).
DRIFT_BY_STATUS_SCHEMA = (
    FrameColumn("post_status", "string", "The post's status now ('deleted': no such post)"),
    FrameColumn("posts_corrected", "int64", "Posts of that status the day's reconcile corrected"),
    FrameColumn(
        "comments_count_change",
        "int64",
        "Total change of their comments_count (negative: the counter had run ahead)",
    ),
)
BUILDING_FREE_SHARE_SCHEMA = (
    FrameColumn("building_id", "string", "chessboard.buildings.id (uuid)"),
    FrameColumn("name", "string", "The building's name"),
    FrameColumn(
        "total_count", "int64", "The building's active property objects (not deleted, not Hidden)"
    ),
    FrameColumn("free_count", "int64", "Its free property objects (not deleted, status Free)"),
    FrameColumn("free_share", "double", "free_count / total_count; null when total_count is 0"),
)
SCRAPING_OUTCOMES_SCHEMA = (
    FrameColumn("tenant", "string", "The tenant's name"),
    FrameColumn("domain", "string", "The target URL's host"),
    FrameColumn("status", "string", "The jobs' status now (queued, running, succeeded, ...)"),
    FrameColumn("jobs", "int64", "Jobs accepted that UTC day with that status"),
    FrameColumn("attempts", "int64", "Their fetch attempts, summed"),
    FrameColumn(
        "median_seconds", "double", "Median seconds from acceptance to finish; null if none did"
    ),
)


def column_names(schema: tuple[FrameColumn, ...]) -> list[str]:
    return [column.name for column in schema]


def _query(name: str) -> TextClause:
    return text(load_queries("pin_orchestration", "analyst.sql")[name])


def reconcile_runs_frame(engine: Engine, partition: str) -> pd.DataFrame:
    """`news/post_comment_counts` for a day: one row per reconcile run of that partition,
    the posts it reconciled, the drift it corrected, and its corrections (a list of
    {post_id, from, to}; the first 50 a run made)."""
    with engine.connect() as conn:
        rows = conn.execute(
            _query("reconcile_runs_of_partition"),
            {"job_code": RECONCILE_JOB_CODE, "partition": partition},
        ).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=RECONCILE_COLUMNS)


def project_aggregates_frame(engine: Engine, project_id: uuid.UUID) -> pd.DataFrame:
    """`chessboard/project_aggregates` for a project: one row per level (project, building,
    layout_group, layout) with its stored counters and bounds."""
    with engine.connect() as conn:
        result = conn.execute(_query("project_aggregates_of_project"), {"project_id": project_id})
        return pd.DataFrame(result.all(), columns=list(result.keys()))


def scraping_results_frame(engine: Engine, day: str) -> pd.DataFrame:
    """`scraping/results` for a UTC day (the day the jobs were accepted): one row per job,
    its tenant, url, status, attempts, timings and its result object's key, size, sha256."""
    with engine.connect() as conn:
        result = conn.execute(_query("scraping_jobs_of_day"), {"day": day})
        return pd.DataFrame(result.all(), columns=list(result.keys()))


def drift_by_post_status(engine: Engine, runs: pd.DataFrame) -> pd.DataFrame:
    """Per post status: how many posts a day's reconcile corrected and by how much their
    comments_count changed in total (negative: the counter had run ahead)."""
    corrections = [c for kept in runs["corrections"] for c in kept]
    if not corrections:
        return pd.DataFrame(columns=column_names(DRIFT_BY_STATUS_SCHEMA))
    frame = pd.DataFrame(corrections)
    frame["post_id"] = frame["post_id"].map(uuid.UUID)
    with engine.connect() as conn:
        statuses = pd.DataFrame(
            conn.execute(_query("post_statuses"), {"post_ids": list(frame["post_id"])}).all(),
            columns=["post_id", "post_status"],
        )
    frame = frame.merge(statuses, on="post_id", how="left").fillna({"post_status": "deleted"})
    frame["change"] = frame["to"] - frame["from"]
    return (
        frame.groupby("post_status")
        .agg(posts_corrected=("post_id", "nunique"), comments_count_change=("change", "sum"))
        .reset_index()[column_names(DRIFT_BY_STATUS_SCHEMA)]
    )


def building_free_share(aggregates: pd.DataFrame) -> pd.DataFrame:
    """Per building of a project: free property objects as a share of all (NaN when
    the building has none)."""
    buildings = aggregates[aggregates["level"] == "building"]
    share = buildings["free_count"] / buildings["total_count"].where(buildings["total_count"] > 0)
    return pd.DataFrame(
        {
            "building_id": buildings["id"].map(str).to_numpy(),
            "name": buildings["name"].to_numpy(),
            "total_count": buildings["total_count"].to_numpy(),
            "free_count": buildings["free_count"].to_numpy(),
            "free_share": share.to_numpy(),
        }
    )


def scraping_outcomes(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per tenant, target domain and status: a day's jobs, the attempts they took and the
    median seconds from acceptance to finish."""
    if jobs.empty:
        return pd.DataFrame(columns=column_names(SCRAPING_OUTCOMES_SCHEMA))
    frame = jobs.assign(domain=jobs["url"].map(lambda url: urlsplit(url).hostname or ""))
    return (
        frame.groupby(["tenant", "domain", "status"])
        .agg(
            jobs=("job_id", "count"),
            attempts=("attempts", "sum"),
            median_seconds=("seconds_to_finish", "median"),
        )
        .reset_index()[column_names(SCRAPING_OUTCOMES_SCHEMA)]
    )
