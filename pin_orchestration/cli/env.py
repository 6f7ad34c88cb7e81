"""`pin env`: the environment an analyst's shell needs to reach what `pin up` runs.

`eval "$(pin env)"` exports the platform database, Dagster's instance storage, PIN_HOME and
DAGSTER_HOME (and the results store's bucket when one is configured), so
`DagsterInstance.get()` and `defs.load_asset_value(...)` find the same state as the stack.
"""

from __future__ import annotations

import os
import shlex

import click

from pin_orchestration.platform.db import dagster_storage_url
from pin_orchestration.platform.defaults import DAGSTER_HOME_DIR, DAGSTER_YAML, PGDATA_DIR
from pin_orchestration.platform.settings import Settings

# Passed through when set: where the derived frames and results live (docs/configuration.md).
RESULTS_STORE_VARIABLES = ("PIN_S3_BUCKET", "PIN_S3_ENDPOINT_URL", "PIN_S3_REGION")


def analyst_environment(settings: Settings, environ: dict[str, str]) -> dict[str, str]:
    """The variables, in the order printed; raises ClickException when the embedded default
    is not running (there is then no database to point at)."""
    database_url = settings.database_url or _running_embedded_url(settings)
    variables = {
        "PIN_DATABASE_URL": database_url,
        "PIN_DAGSTER_PG_URL": settings.dagster_pg_url or dagster_storage_url(database_url),
        "PIN_HOME": str(settings.home),
        # What `pin up` gives Dagster (devstack.prepare_dagster_home).
        "DAGSTER_HOME": environ.get("DAGSTER_HOME") or str(settings.home / DAGSTER_HOME_DIR),
    }
    variables.update({name: environ[name] for name in RESULTS_STORE_VARIABLES if environ.get(name)})
    return variables


def _running_embedded_url(settings: Settings) -> str:
    from pin_orchestration.platform.embedded import running_embedded_url

    url = running_embedded_url(settings.home / PGDATA_DIR)
    if url is None:
        raise click.ClickException(
            f"no embedded PostgreSQL is running under PIN_HOME={settings.home}: start the "
            "stack with `pin up` (or `./scripts/run`) there, set PIN_HOME to the one it "
            "runs on, or set PIN_DATABASE_URL to the platform database"
        )
    return url


@click.command("env")
def env() -> None:
    """Print `export …` lines for the running stack: `eval "$(pin env)"`."""
    variables = analyst_environment(Settings.from_env(), dict(os.environ))
    dagster_home = variables["DAGSTER_HOME"]
    if not os.path.isfile(os.path.join(dagster_home, DAGSTER_YAML.name)):
        click.echo(
            f"warning: {dagster_home} holds no dagster.yaml yet; `pin up` writes it",
            err=True,
        )
    for name, value in variables.items():
        click.echo(f"export {name}={shlex.quote(value)}")
