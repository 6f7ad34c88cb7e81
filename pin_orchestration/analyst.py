"""Asset values as pandas DataFrames, read from the tables the jobs keep (no Dagster here:
the IO managers in `pin_orchestration.resources.analyst_io` call these), and the
analysts' derived tables computed from them."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pandas as pd
from sqlalchemy import Engine

from pin_orchestration.platform.frames import FrameColumn
from pin_orchestration.platform.sql import NamedQueries

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
    FrameColumn("post_status", "string", "The post's status when its counter was corrected"),
    FrameColumn(
        "posts_corrected",
        "int64",
        "Corrections of that status by the day's runs (a post corrected twice counts twice)",
    ),
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


_query = NamedQueries("pin_orchestration", "analyst.sql")


class ReconcileValueMissing(LookupError):
    """A day of news/post_comment_counts has no recorded value: no reconcile run of it is
    recorded, or its runs predate the totals by post status (migration 0023)."""


def reconcile_runs_frame(engine: Engine, partition: str) -> pd.DataFrame:
    """`news/post_comment_counts` for a day: one row per reconcile run of that partition
    (whatever its status: a cancelled or failed run's committed batches count), the posts
    it reconciled, the drift it corrected, and its first corrections (a list of
    {post_id, from, to}; at most 50 — the totals are in `drift_by_post_status`).

    Read from the record each run keeps for good, never emptied by pin-retention; a day
    with no run recorded raises ReconcileValueMissing naming it, never an empty frame."""
    with engine.connect() as conn:
        rows = conn.execute(_query("reconcile_runs_of_partition"), {"partition": partition}).all()
    if not rows:
        raise ReconcileValueMissing(
            f"partition {partition!r} of news/post_comment_counts has no reconcile run "
            "recorded: it was never reconciled (a run skipped on a held lock is recorded "
            f"as skipped); materialize it (job news_comment_reconcile, partition {partition})"
        )
    return pd.DataFrame(
        [tuple(getattr(r, c) for c in RECONCILE_COLUMNS) for r in rows], columns=RECONCILE_COLUMNS
    )


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


def drift_by_post_status(engine: Engine, runs: pd.DataFrame, partition: str) -> pd.DataFrame:
    """Per post status: how many corrections a day's reconcile runs (`runs`, the day's
    news/post_comment_counts) made and by how much they changed comments_count in total
    (negative: the counter had run ahead). Every correction counts, each batch's totals
    stored with the batch, whatever the run's status."""
    run_ids = sorted(set(runs["run_id"]))
    if not run_ids:
        return pd.DataFrame(columns=column_names(DRIFT_BY_STATUS_SCHEMA)).astype(
            {"posts_corrected": "int64", "comments_count_change": "int64"}
        )
    params = {"partition": partition, "run_ids": run_ids}
    with engine.connect() as conn:
        unrecorded = list(
            conn.execute(_query("reconcile_runs_without_status_totals"), params).scalars()
        )
        if unrecorded:
            raise ReconcileValueMissing(
                f"partition {partition!r}: reconcile runs {', '.join(unrecorded)} ran before "
                "their corrections were recorded by post status (migration 0023); this "
                "day's drift by post status is not known"
            )
        rows = conn.execute(_query("reconcile_corrections_by_post_status"), params).all()
    frame = pd.DataFrame([tuple(r) for r in rows], columns=column_names(DRIFT_BY_STATUS_SCHEMA))
    return frame.astype({"posts_corrected": "int64", "comments_count_change": "int64"})


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
