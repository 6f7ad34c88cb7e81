"""Where the local stack listens and what it reads by default, each declared once: the
CLI's option defaults, the settings' defaults and help, the dev stack and the benches
refer to these names (the README and docs spell the values out for people)."""

from __future__ import annotations

from pathlib import Path

# The local services listen on loopback only unless told otherwise (`--host`).
LOOPBACK = "127.0.0.1"
# `pin api`: the scraping intake/query API.
API_PORT = 8000
API_URL = f"http://{LOOPBACK}:{API_PORT}"
# `pin up`: the Dagster UI (dagster dev).
DAGSTER_UI_PORT = 3000
# `pin up` / `pin metrics serve`: the Prometheus endpoint.
METRICS_PORT = 9108

# Read from the directory `pin up` runs in (the repository root).
DAGSTER_YAML = Path("dagster.yaml")
WORKSPACE_YAML = Path("workspace.yaml")

# Under PIN_HOME: the embedded PostgreSQL's data directory and the DAGSTER_HOME `pin up`
# prepares.
PGDATA_DIR = "pgdata"
DAGSTER_HOME_DIR = "dagster_home"
