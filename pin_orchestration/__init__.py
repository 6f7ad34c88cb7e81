"""pin-orchestration: the PIN platform's PostgreSQL-backed background work, run by Dagster."""

from pin_orchestration.platform.dagster_warnings import silence_intended_dagster_warnings

silence_intended_dagster_warnings()
