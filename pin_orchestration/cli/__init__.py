"""`pin`: the operators' command line. One module per area, each a click group (or a few
commands) added to `main` here: platform (up, db, demo, locks, metrics), news_reconcile
(`pin news`), news_snapshot_detach (`pin detach`), chessboard, retention, scraping
(`pin api`, `pin scraping`), tenant (`pin tenant`), faults (`pin faults`), env (`pin env`)."""

from __future__ import annotations

from typing import Any

import click
import sqlalchemy.exc

from pin_orchestration.cli.chessboard import chessboard
from pin_orchestration.cli.env import env
from pin_orchestration.cli.faults import faults
from pin_orchestration.cli.logs import LOG_LEVELS, configure_logging
from pin_orchestration.cli.news_reconcile import news
from pin_orchestration.cli.news_snapshot_detach import detach
from pin_orchestration.cli.platform import db, demo, locks, metrics, up
from pin_orchestration.cli.retention import retention
from pin_orchestration.cli.scraping import api, scraping
from pin_orchestration.cli.tenant import tenant
from pin_orchestration.platform.db import describe_database
from pin_orchestration.platform.settings import Settings, SettingsError

# undefined_table, invalid_schema_name: the schema a command needs was never created.
_NOT_MIGRATED = ("42P01", "3F000")


class _PinGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        # Expected conditions are the operator's to fix: say which setting or database and
        # what to run, without a traceback.
        try:
            return super().invoke(ctx)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from exc
        except sqlalchemy.exc.ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) not in _NOT_MIGRATED:
                raise
            raise click.ClickException(
                f"{_database()} is not migrated ({_first_line(exc.orig)}): run "
                "`pin db upgrade` (or `pin up`) with the same PIN_HOME / PIN_DATABASE_URL"
            ) from exc
        except sqlalchemy.exc.OperationalError as exc:
            raise click.ClickException(
                f"cannot reach {_database()}: {_first_line(exc.orig)}"
            ) from exc


def _database() -> str:
    return describe_database(Settings.from_env())


def _first_line(error: BaseException | None) -> str:
    return str(error).strip().splitlines()[0] if error is not None and str(error) else ""


@click.group(cls=_PinGroup)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    envvar="PIN_LOG_LEVEL",
    help="pin's own log level. At info Dagster's daemon, webserver and runs under `pin up` "
    "print only warnings; debug brings back their detail (sensor ticks, run events).",
)
@click.option("-v", "--verbose", is_flag=True, help="Same as --log-level debug")
@click.pass_context
def main(ctx: click.Context, log_level: str, verbose: bool) -> None:
    """pin-orchestration operator commands."""
    level = "debug" if verbose else log_level.lower()
    ctx.obj = {"log_level": level}
    configure_logging(level)


for command in (
    up,
    db,
    demo,
    locks,
    metrics,
    news,
    detach,
    chessboard,
    retention,
    api,
    tenant,
    scraping,
    faults,
    env,
):
    main.add_command(command)
