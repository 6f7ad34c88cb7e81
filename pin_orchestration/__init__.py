"""pin-orchestration: the PIN platform's PostgreSQL-backed background work, run by Dagster."""
