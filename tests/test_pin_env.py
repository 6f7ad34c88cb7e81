"""`pin env`: the export lines of the configured services, and a clear refusal when the
embedded default it would point at is not running (the running one: tests/test_analyst.py,
whose docs/analysts.md snippets run with nothing but `eval "$(pin env)"`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pin_orchestration.platform.db import dagster_storage_url

PIN = [sys.executable, "-m", "pin_orchestration.cli"]
STACK_VARIABLES = ("PIN_DATABASE_URL", "PIN_DAGSTER_PG_URL", "PIN_HOME", "DAGSTER_HOME")


def clean_env(**variables: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in STACK_VARIABLES and not k.startswith("PIN_S3_")
    }
    return {**env, **variables}


def test_pin_env_exports_the_configured_services_for_a_shell(db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "pin home"  # a space: the values are quoted for the shell
    env = clean_env(PIN_DATABASE_URL=db_url, PIN_HOME=str(home), PIN_S3_BUCKET="frames")
    printed = subprocess.run(
        [*PIN, "env"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert all(line.startswith("export ") for line in printed.stdout.splitlines())
    # What a shell has after eval: only the printed lines decide it.
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1"; env', "bash", printed.stdout],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    exported = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
    assert {name: exported[name] for name in (*STACK_VARIABLES, "PIN_S3_BUCKET")} == {
        "PIN_DATABASE_URL": db_url,
        "PIN_DAGSTER_PG_URL": dagster_storage_url(db_url),
        "PIN_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster_home"),
        "PIN_S3_BUCKET": "frames",
    }
    # No stack wrote DAGSTER_HOME there yet: said on stderr, never into the eval'd text.
    assert "pin up" in printed.stderr


def test_pin_env_without_a_running_embedded_default_says_where_it_looked(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    printed = subprocess.run(
        [*PIN, "env"],
        env=clean_env(PIN_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 1
    assert printed.stdout == ""
    assert f"no embedded PostgreSQL is running under PIN_HOME={home}" in printed.stderr
    assert "pin up" in printed.stderr and "Traceback" not in printed.stderr
    assert not home.exists()  # nothing was started or created there
