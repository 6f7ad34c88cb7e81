"""Dagster's project tooling applies to the project (issue 32): `dg check defs` loads the
code location that [tool.dg] names, the same one as [tool.dagster] and workspace.yaml.

`dg` runs with a scratch DAGSTER_HOME: without one, Dagster's CLIs read the repository's
dagster.yaml as their instance, and that file is `pin up`'s template (its storage URL comes
from PIN_DAGSTER_PG_URL, which only `pin up` and `pin env` set)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_dg_targets_the_code_location_dagster_loads() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    [location] = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"]
    module = location["python_module"]["module_name"]
    name = location["python_module"]["location_name"]
    assert config["dg"]["directory_type"] == "project"
    project = config["dg"]["project"]
    assert (project["code_location_target_module"], project["code_location_name"]) == (
        module,
        name,
    )
    assert (config["dagster"]["module_name"], config["dagster"]["code_location_name"]) == (
        module,
        name,
    )
    assert module.startswith(project["root_module"] + ".")


def test_dg_check_defs_passes(tmp_path: Path) -> None:
    dg = Path(sys.executable).with_name("dg")
    assert dg.exists(), f"{dg} is missing: install the dev extras (pip install -e '.[dev]')"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIN_", "DAGSTER_"))}
    env |= {
        # A fresh instance, and no user-level dg.toml or telemetry id from this machine.
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "HOME": str(tmp_path),
        # The venv dg runs from is the active one (else dg warns it is not the project's .venv).
        "VIRTUAL_ENV": sys.prefix,
        "NO_COLOR": "1",
    }
    (tmp_path / "dagster_home").mkdir()
    result = subprocess.run(
        [str(dg), "check", "defs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "All definitions loaded successfully." in result.stdout, output
