"""Runbook "drop a stuck lock" as a job, for the UI (`pin locks release KEY` in the shell)."""

# No `from __future__ import annotations`: Dagster reads the config type from the
# annotation at decoration time.

from dagster import Config, Failure, OpExecutionContext, in_process_executor, job, op
from pydantic import Field

from pin_orchestration.coordination.locks import force_release_lock
from pin_orchestration.resources.database import DatabaseResource


class ReleaseLockConfig(Config):
    lock_key: str = Field(
        description="The lock to drop (see `pin locks list`): its full key or the job code"
    )


@op
def release_lock(
    context: OpExecutionContext, config: ReleaseLockConfig, database: DatabaseResource
) -> None:
    released = force_release_lock(database.get_engine(), config.lock_key)
    if released is None:
        raise Failure(f"no lock {config.lock_key!r}: `pin locks list` shows the held ones")
    context.log.info(f"released lock {released}")


@job(
    name="pin_release_lock",
    executor_def=in_process_executor,
    description="Runbook: drop a lock whose holder is stuck (config: lock_key). Held locks: "
    "`pin locks list`.",
)
def pin_release_lock() -> None:
    release_lock()
