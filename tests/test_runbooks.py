"""docs/runbooks.md names only jobs and commands that exist, and every alert check has a row."""

from __future__ import annotations

import re
from pathlib import Path

import click

from pin_orchestration.cli import main
from pin_orchestration.definitions import build_definitions

RUNBOOKS = (Path(__file__).resolve().parent.parent / "docs" / "runbooks.md").read_text()


def test_every_action_is_a_job_and_a_command() -> None:
    repo = build_definitions().get_repository_def()
    jobs = {j.name for j in repo.get_all_jobs()}
    actions = RUNBOOKS.split("## Actions", 1)[1]
    rows = [line for line in actions.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 10
    for row in rows:
        job = re.search(r"\| `([a-z_]+)`", row)
        assert job and job.group(1) in jobs, row
    commands = re.findall(r"`pin ([^`]+)`", RUNBOOKS)
    assert len(commands) >= 15
    for command in commands:
        found: click.Command = main
        for word in command.split():
            if not isinstance(found, click.Group):
                break  # the rest are the command's arguments
            found = found.get_command(click.Context(found), word)
            assert found is not None, f"no `pin {command}`"
        assert not isinstance(found, click.Group), f"`pin {command}` names only a group"


def test_every_alert_check_has_a_runbook_row() -> None:
    repo = build_definitions().get_repository_def()
    alerts = RUNBOOKS.split("## Alerts", 1)[1].split("## ", 1)[0]
    for key in repo.asset_graph.asset_check_keys:
        assert f"{key.asset_key.to_user_string()}: `{key.name}`" in alerts, key
