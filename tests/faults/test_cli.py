"""`pin faults` finds the suite beside the package in the source checkout, and says how to
get it where the package runs without one (an installed wheel); the wheel leaves it out."""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path

import pytest
import setuptools
from click.testing import CliRunner

from pin_orchestration.cli import main

# The module, not the `faults` group that pin_orchestration.cli exports under its name.
faults_cli = importlib.import_module("pin_orchestration.cli.faults")

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_checkout_runs_the_suite_from_its_root_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the command adds to the path and to its children's PYTHONPATH is undone after.
    monkeypatch.syspath_prepend(str(CHECKOUT))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    assert faults_cli.CHECKOUT == CHECKOUT
    result = CliRunner().invoke(main, ["faults", "list"])
    assert result.exit_code == 0, result.output
    assert "scraping-sigkill\tscraping" in result.output


@pytest.mark.parametrize("command", [["faults", "list"], ["faults", "run", "--quick"]])
def test_without_the_suite_beside_the_package_it_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setattr(faults_cli, "CHECKOUT", tmp_path)  # as site-packages would be
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1
    assert result.output == (
        "Error: The fault suite ships with the source checkout, not with the package: clone "
        f"the repository and run `pin faults run` from it (no faults/ in {tmp_path}).\n"
    )


def test_the_wheel_leaves_the_suite_out() -> None:
    config = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = setuptools.find_packages(str(CHECKOUT), include=include)
    assert "pin_orchestration.cli" in packages
    assert not [p for p in packages if p.split(".")[0] in ("faults", "bench", "tests")]
