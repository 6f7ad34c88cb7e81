"""Dagster wiring of chessboard project-aggregates-recalc (seed 002): the per-project asset,
its dynamic partitions and its checks. The work itself is in pin_orchestration.chessboard.

A materialization of partition <project id> is one recalculated project: the drain runs
launched by `chessboard_project_recalc_sensor` log them as projects come off the queue, and
an operator forces a recalc of chosen projects by materializing (backfilling) their
partitions in the UI.
"""
# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

import uuid

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from sqlalchemy import Engine

from pin_orchestration.chessboard.drain import POISON_ALERT, force_recalc_project
from pin_orchestration.chessboard.queue import poison_rows
from pin_orchestration.chessboard.recalc import RecalcResult, find_divergence, missing_projects
from pin_orchestration.coordination.job_identity import JobIdentity
from pin_orchestration.resources.analyst_io import PostgresAssetReader
from pin_orchestration.resources.database import DatabaseResource

PROJECT_AGGREGATES = AssetKey(["chessboard", "project_aggregates"])
# The recalc queue's health: unpartitioned, so its alert checks show their state on its
# page (a check on the per-project asset reads "Not evaluated" after the next recalc).
RECALC_HEALTH = AssetKey(["chessboard", "recalc_health"])
DIVERGENCE_CHECK = "aggregates_match_source_of_truth"
# The drain job, which the health asset reports on; here, not in jobs/chessboard.py,
# because jobs import assets and never the reverse. Its runs record nothing themselves
# (each recalc is a materialization): a failed one is counted under its Dagster name.
DRAIN_JOB = JobIdentity("chessboard_project_recalc_drain", records_runs=False)
POISON_CHECK = "no_poison_recalc_requests"

chessboard_projects = DynamicPartitionsDefinition(name="chessboard_projects")


def project_id_of(partition_key: str) -> uuid.UUID:
    try:
        return uuid.UUID(partition_key)
    except ValueError:
        raise Failure(
            description=f"partition key must be a project id (uuid), got {partition_key!r}"
        ) from None


def refuse_missing_projects(engine: Engine, project_ids: list[uuid.UUID]) -> None:
    """Fail naming the ids that are no project (before anything is checked or registered)."""
    with engine.connect() as conn:
        missing = missing_projects(conn, project_ids)
    if missing:
        raise Failure(
            description=f"no such project: {', '.join(map(str, missing))} (not in "
            "chessboard.projects): check the ids; nothing was checked or registered"
        )


def ensure_project_partitions(instance: DagsterInstance, project_ids: list[uuid.UUID]) -> None:
    """A dynamic partition must exist before it is materialized; adding is idempotent."""
    if project_ids:
        instance.add_dynamic_partitions(chessboard_projects.name, [str(p) for p in project_ids])


def recalc_metadata(recalc: RecalcResult) -> dict[str, object]:
    return {k: v for k, v in recalc.as_metadata().items() if v is not None}


@asset(
    key=PROJECT_AGGREGATES,
    partitions_def=chessboard_projects,
    # Analysts load a project's value (its stored aggregates) as a DataFrame from PostgreSQL.
    # Bundled, so any Definitions holding the asset (tests, subsets) can load it.
    io_manager_def=PostgresAssetReader(),
    group_name="chessboard",
    kinds={"postgres"},
    description="Denormalized counters and price/area bounds of one chessboard project, its "
    "buildings, layouts and layout groups, recalculated from property_objects/layouts (seed "
    "002). Materializing a partition forces a recalc of that project now; changed rows get "
    "version + 1 and a snapshot event in chessboard.event_outbox.",
)
def project_aggregates(
    context: AssetExecutionContext, database: DatabaseResource
) -> MaterializeResult:
    project_id = project_id_of(context.partition_key)
    recalc = force_recalc_project(database.get_engine(), project_id)
    if recalc.skipped:
        context.log.info(f"project {project_id} is {recalc.skip_reason}: nothing recalculated")
        return MaterializeResult(metadata={"skipped": recalc.skip_reason or ""})
    return MaterializeResult(metadata={**recalc_metadata(recalc), "trigger": "force"})


@asset_check(
    asset=PROJECT_AGGREGATES,
    name=DIVERGENCE_CHECK,
    partitions_def=chessboard_projects,
    # The analysts' chessboard/building_free_share is computed from these aggregates: a run
    # does not build it past a failed check, nor does automation on a partition that failed.
    blocking=True,
    description="Runbook 'divergence check': the project's stored aggregates equal "
    "count/min/max over its property objects and layouts. A failure is fixed by "
    "materializing the partition (force recalc). Blocking: no frame is built from "
    "aggregates that failed it.",
)
def aggregates_match_source_of_truth(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    engine = database.get_engine()
    project_id = project_id_of(context.partition_key)
    refuse_missing_projects(engine, [project_id])
    evaluation = divergence_evaluation(engine, project_id)
    return AssetCheckResult(
        passed=evaluation.passed, severity=evaluation.severity, metadata=evaluation.metadata
    )


def latest_materialization(
    instance: DagsterInstance, project_id: uuid.UUID
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The project's latest materialization, which a divergence check run now judges: an
    evaluation naming it is the partition's current check status (the UI's, and what the
    analysts' automation reads); one naming none is never current. A check run as a step
    gets this from Dagster; the runbook job's evaluations give it themselves."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=PROJECT_AGGREGATES, asset_partitions=[str(project_id)]),
        limit=1,
    ).records
    if not records:
        return None
    latest = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=latest.storage_id, run_id=latest.run_id, timestamp=latest.timestamp
    )


def divergence_evaluation(
    engine: Engine,
    project_id: uuid.UUID,
    target: AssetCheckEvaluationTargetMaterializationData | None = None,
) -> AssetCheckEvaluation:
    """The divergence check of one project as an evaluation of its partition (of `target`,
    its latest materialization), so the runbook job can log it for any chosen projects."""
    with engine.connect() as conn:
        diverged = find_divergence(conn, project_id)
    metadata: dict[str, object] = {"diverged_rows": len(diverged)}
    if diverged:
        rows = "\n".join(f"| {d.entity} | {d.id} | {d.stored} | {d.truth} |" for d in diverged[:50])
        metadata["divergence"] = MetadataValue.md(
            f"| entity | id | stored | truth |\n|---|---|---|---|\n{rows}"
        )
    return AssetCheckEvaluation(
        asset_key=PROJECT_AGGREGATES,
        check_name=DIVERGENCE_CHECK,
        partition=str(project_id),
        target_materialization_data=target,
        passed=not diverged,
        severity=AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def poison_evaluation(rows: list[dict[str, object]]) -> AssetCheckEvaluation:
    """Passed when no queue row has reached the poison threshold; else CHESSBOARD_RECALC_POISON.

    An evaluation (not a result) so a drain run can log it the moment it poisons a row.
    """
    metadata: dict[str, object] = {"poison_rows": len(rows)}
    if rows:
        metadata["alert"] = POISON_ALERT
        table = "\n".join(
            f"| {r['project_id']} | {r['attempt_count']} | {r['last_error']} |" for r in rows[:50]
        )
        metadata["rows"] = MetadataValue.md(
            f"| project_id | attempt_count | last_error |\n|---|---|---|\n{table}"
        )
        metadata["runbook"] = (
            "read last_error, check the project's property objects/layouts, fix, then "
            "run job chessboard_reset_poison_row (or `pin chessboard reset-poison ID`)"
        )
    return AssetCheckEvaluation(
        asset_key=RECALC_HEALTH,
        check_name=POISON_CHECK,
        passed=not rows,
        severity=AssetCheckSeverity.ERROR,
        metadata=metadata,
        description=f"{POISON_ALERT}: {len(rows)} project(s) left in the queue after "
        "repeated recalc failures"
        if rows
        else None,
    )


@asset_check(
    asset=RECALC_HEALTH,
    name=POISON_CHECK,
    description="CHESSBOARD_RECALC_POISON: no queue row has failed recalc poison_threshold "
    "(5) times. Drain runs report this check whenever they poison a row.",
)
def no_poison_recalc_requests(
    context: AssetCheckExecutionContext, database: DatabaseResource
) -> AssetCheckResult:
    with database.get_engine().connect() as conn:
        evaluation = poison_evaluation(poison_rows(conn))
    return AssetCheckResult(
        passed=evaluation.passed,
        severity=evaluation.severity,
        metadata=evaluation.metadata,
        description=evaluation.description,
    )
