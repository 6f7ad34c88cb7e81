"""`pin`: the operators' command line. One module per area, each a click group (or a few
commands) added to `main` here: platform (up, db, demo, locks, metrics), news_reconcile
(`pin news`), news_snapshot_detach (`pin detach`), chessboard, retention, scraping
(`pin api`, `pin tenant`, `pin scraping`), faults (`pin faults`), env (`pin env`)."""

from __future__ import annotations

import logging
from typing import Any

import click

from pin_orchestration.cli.chessboard import chessboard
from pin_orchestration.cli.env import env
from pin_orchestration.cli.faults import faults
from pin_orchestration.cli.news_reconcile import news
from pin_orchestration.cli.news_snapshot_detach import detach
from pin_orchestration.cli.platform import db, demo, locks, metrics, up
from pin_orchestration.cli.retention import retention
from pin_orchestration.cli.scraping import api, scraping, tenant
from pin_orchestration.settings import SettingsError


class _PinGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        # A bad environment variable is the operator's to fix: say which, without a traceback.
        try:
            return super().invoke(ctx)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_PinGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG")
def main(verbose: bool) -> None:
    """pin-orchestration operator commands."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # pgserver logs every initdb/pg_ctl command line at INFO; only its problems concern
    # an operator (-v shows the rest).
    logging.getLogger("pgserver").setLevel(logging.DEBUG if verbose else logging.WARNING)


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
