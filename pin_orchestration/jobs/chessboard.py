"""Jobs of chessboard project-aggregates-recalc: the drain run (launched by
`chessboard_project_recalc_sensor`, sensors/chessboard.py), and the runbook actions (force
recalc, reset a poison row, publish the outbox once) launchable from the UI with config.
The drain op calls `chessboard.drain.drain_loop`, which claims with the named queries of
`chessboard/queries.sql` (through `chessboard.queue.query`).

A drain run takes rows with FOR UPDATE SKIP LOCKED, logs one materialization per project
and stays up to its max duration, waking as rows fall due."""
# No `from __future__ import annotations`: Dagster reads config/resource types from the
# annotations at definition time.

import time

from dagster import (
    AssetMaterialization,
    Config,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from pin_orchestration.assets.chessboard import (
    DRAIN_JOB,
    PROJECT_AGGREGATES,
    divergence_evaluation,
    ensure_project_partitions,
    latest_materialization,
    poison_evaluation,
    project_id_of,
    recalc_metadata,
    refuse_missing_projects,
)
from pin_orchestration.chessboard.drain import drain_loop
from pin_orchestration.chessboard.outbox.publisher import LOCK_KEY, make_sink, publish_once
from pin_orchestration.chessboard.outcomes import ProjectOutcome
from pin_orchestration.chessboard.queue import (
    DRAIN_RUN_OPTIONS,
    RecalcConfigError,
    RecalcPolicy,
    force_recalc_now,
    poison_rows,
    reset_poison_row,
)
from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.locks import LockLost, default_holder
from pin_orchestration.platform.options import dagster_config
from pin_orchestration.platform.settings import Settings
from pin_orchestration.resources.database import DatabaseResource

# dagster.yaml caps concurrent runs per value of this tag (pin/drain: limit 2).
DRAIN_TAGS = {"pin/drain": "chessboard-project-recalc"}


# The drain run's config: the drain fields of RecalcPolicy, their defaults and help.
DrainConfig = dagster_config(RecalcPolicy, "DrainConfig", names=DRAIN_RUN_OPTIONS)


@op(
    description="Drain passes, waking when the next row falls due, until nothing is queued "
    "(or the max duration): each recalculated project is logged as a materialization of "
    "its partition.",
)
def drain_chessboard_project_recalc_queue(
    context: OpExecutionContext, config: DrainConfig, database: DatabaseResource
) -> None:
    policy = RecalcPolicy(**config.model_dump())
    try:
        policy.validate()
    except RecalcConfigError as exc:
        raise Failure(description=str(exc)) from exc
    engine = database.get_engine()
    deadline = time.monotonic() + policy.max_run_duration_seconds
    totals = {"recalculated": 0, "skipped": 0, "failed": 0}

    def report(outcome: ProjectOutcome) -> None:
        totals[outcome.result] += 1
        if outcome.result == "recalculated" and outcome.recalc is not None:
            ensure_project_partitions(context.instance, [outcome.project_id])
            context.log_event(
                AssetMaterialization(
                    asset_key=PROJECT_AGGREGATES,
                    partition=str(outcome.project_id),
                    metadata={
                        **recalc_metadata(outcome.recalc),
                        "trigger": "queue",
                        "requested_count": outcome.requested_count,
                        "last_reason": outcome.last_reason,
                        "duration_ms": round(outcome.duration_seconds * 1000, 2),
                    },
                )
            )
        elif outcome.result == "failed":
            context.log.error(
                f"project_recalc_failed project_id={outcome.project_id} "
                f"attempt_count={outcome.attempt_count} error={outcome.error}"
            )
        if outcome.poisoned:
            with engine.connect() as conn:
                context.log_event(poison_evaluation(poison_rows(conn, policy=policy)))

    # A live run keeps polling (woken as rows fall due) so that under a steady stream a row
    # is taken within the floor of falling due, not after the next sensor tick + run launch.
    with stop_requested_on_signals(reraise=True) as stop:
        loop = drain_loop(
            engine,
            stop,
            policy=policy,
            deadline=deadline,
            exit_when_idle=True,
            on_outcome=report,
        )
    context.log.info(f"drain finished ({loop.ended}, {loop.passes} passes): {totals}")


@job(
    name=DRAIN_JOB.name,
    executor_def=in_process_executor,
    tags=DRAIN_TAGS,
    description="Drain chessboard.project_recalc_requests (seed 002, AGG-2). Launched by "
    "chessboard_project_recalc_sensor; several may run at once (capped by tag pin/drain).",
)
def chessboard_project_recalc_drain() -> None:
    drain_chessboard_project_recalc_queue()


class ProjectsConfig(Config):
    project_ids: list[str] = Field(description="Project ids (uuid)")


@op
def queue_forced_recalcs(
    context: OpExecutionContext, config: ProjectsConfig, database: DatabaseResource
) -> None:
    """Runbook 'force recalc': each project's queue row becomes due now (the next drain run
    recalculates it). To recalc right away instead, materialize the partitions."""
    ids = [project_id_of(p) for p in config.project_ids]
    missing = [p for p in ids if not force_recalc_now(database.get_engine(), p)]
    ensure_project_partitions(context.instance, [p for p in ids if p not in missing])
    if missing:
        raise Failure(description=f"no such project(s): {', '.join(map(str, missing))}")
    context.log.info(f"queued a recalc due now for {len(ids)} project(s)")


@job(name="chessboard_force_recalc", executor_def=in_process_executor)
def chessboard_force_recalc() -> None:
    queue_forced_recalcs()


@op
def check_project_divergence(
    context: OpExecutionContext, config: ProjectsConfig, database: DatabaseResource
) -> None:
    """Runbook 'divergence check': stored aggregates vs count/min/max over the source of
    truth, reported as the aggregates_match_source_of_truth check of each project's
    partition (a failure is fixed by materializing that partition). An id that is no
    project fails the run before anything is checked or registered."""
    ids = [project_id_of(p) for p in config.project_ids]
    refuse_missing_projects(database.get_engine(), ids)
    ensure_project_partitions(context.instance, ids)
    diverged = 0
    for project_id in ids:
        target = latest_materialization(context.instance, project_id)
        evaluation = divergence_evaluation(database.get_engine(), project_id, target)
        diverged += not evaluation.passed
        context.log_event(evaluation)
    context.log.info(f"{diverged} of {len(ids)} project(s) diverge from the source of truth")


@job(name="chessboard_divergence_check", executor_def=in_process_executor)
def chessboard_divergence_check() -> None:
    check_project_divergence()


@op
def reset_poison_rows(
    context: OpExecutionContext, config: ProjectsConfig, database: DatabaseResource
) -> None:
    """Runbook 'reset a poison row' (after fixing its cause): attempts 0, due now."""
    ids = [project_id_of(p) for p in config.project_ids]
    missing = [p for p in ids if not reset_poison_row(database.get_engine(), p)]
    if missing:
        raise Failure(description=f"no queue row for: {', '.join(map(str, missing))}")
    with database.get_engine().connect() as conn:
        context.log_event(poison_evaluation(poison_rows(conn)))


@job(name="chessboard_reset_poison_row", executor_def=in_process_executor)
def chessboard_reset_poison_row() -> None:
    reset_poison_rows()


@op
def publish_outbox_once(context: OpExecutionContext, database: DatabaseResource) -> None:
    """Publish every pending outbox event once (the long-running publisher is
    `pin chessboard publish`); skipped when that publisher holds the lock."""
    settings = Settings.from_env()
    sink = make_sink(settings.kafka_bootstrap_servers, settings.home)
    try:
        result = publish_once(database.get_engine(), sink, default_holder(context.run.run_id))
    except LockLost as exc:
        raise Failure(description=str(exc)) from exc
    finally:
        sink.close()
    if result is None:
        context.log.info(f"skipped: {LOCK_KEY} held by the running publisher")
        return
    context.log.info(f"published {result.published} of {result.read} event(s) to {sink.describe()}")
    if result.failed:
        raise Failure(description=f"{result.failed} event(s) not acknowledged; they stay pending")


@job(name="chessboard_publish_outbox", executor_def=in_process_executor)
def chessboard_publish_outbox() -> None:
    publish_outbox_once()
