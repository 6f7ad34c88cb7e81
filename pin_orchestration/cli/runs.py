"""Running one of the jobs from the shell the way its Dagster run does: a run id, the
lock holder that goes with it, SIGTERM/SIGINT as a stop request between units of work."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

import click

from pin_orchestration.coordination.cancellation import stop_requested_on_signals
from pin_orchestration.coordination.jobruns import RunStatus
from pin_orchestration.coordination.locks import default_holder


def run_once_and_exit(run: Callable[..., Any]) -> None:
    """Call `run(run_id=, holder=, stop_requested=)`, print its summary as JSON, and exit 1
    when it failed, 130 when it was cancelled."""
    run_id = f"cli-{uuid.uuid4()}"
    with stop_requested_on_signals() as stop:
        result = run(run_id=run_id, holder=default_holder(run_id), stop_requested=stop)
    click.echo(json.dumps(result.summary()))
    if result.status == RunStatus.FAILED:
        sys.exit(1)
    if result.status == RunStatus.CANCELLED:
        sys.exit(130)
