"""Asset values as pandas DataFrames, read from the tables the jobs keep (no Dagster here:
the IO managers in `pin_orchestration.resources.analyst_io` call these), and the
analysts' derived tables computed from them."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pandas as pd
from sqlalchemy import Engine, TextClause, text

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
SCRAPING_OUTCOME_COLUMNS = ["tenant", "domain", "status", "jobs", "attempts", "median_seconds"]
DRIFT_BY_STATUS_COLUMNS = ["post_status", "posts_corrected", "comments_count_change"]


def _query(name: str) -> TextClause:
    return text(load_queries("pin_orchestration", "analyst.sql")[name])


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
    frame = pd.DataFrame([tuple(r) for r in rows], columns=DRIFT_BY_STATUS_COLUMNS)
    return frame.astype({"posts_corrected": "int64", "comments_count_change": "int64"})


def building_free_share(aggregates: pd.DataFrame) -> pd.DataFrame:
    """Per building of a project: free property objects as a share of all (NaN when
    the building has none)."""
    buildings = aggregates[aggregates["level"] == "building"]
    share = buildings["free_count"] / buildings["total_count"].where(buildings["total_count"] > 0)
    return pd.DataFrame(
        {
            "building_id": buildings["id"].to_numpy(),
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
        return pd.DataFrame(columns=SCRAPING_OUTCOME_COLUMNS)
    frame = jobs.assign(domain=jobs["url"].map(lambda url: urlsplit(url).hostname or ""))
    return (
        frame.groupby(["tenant", "domain", "status"])
        .agg(
            jobs=("job_id", "count"),
            attempts=("attempts", "sum"),
            median_seconds=("seconds_to_finish", "median"),
        )
        .reset_index()[SCRAPING_OUTCOME_COLUMNS]
    )
