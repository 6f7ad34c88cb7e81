"""An option set declared once: the Dagster config and the click options derived from it
carry the dataclass's defaults and help, and nothing else."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from pin_orchestration.chessboard.queue import DRAIN_RUN_OPTIONS, RecalcPolicy
from pin_orchestration.options import click_options, dagster_config


def test_dagster_config_carries_the_dataclass_defaults_and_help() -> None:
    config = dagster_config(RecalcPolicy, "DrainConfig", names=DRAIN_RUN_OPTIONS)
    defaults = RecalcPolicy()

    assert list(config.model_fields) == list(DRAIN_RUN_OPTIONS)
    for name, spec in config.model_fields.items():
        assert spec.default == getattr(defaults, name)
        assert spec.description == RecalcPolicy.__dataclass_fields__[name].metadata["help"]
    assert RecalcPolicy(**config(batch_size=7).model_dump()).batch_size == 7


def test_click_options_parse_into_the_dataclass() -> None:
    @click.command()
    @click_options(RecalcPolicy, ("batch_size", "tick_seconds"))
    def command(**options: object) -> None:
        click.echo(repr(RecalcPolicy(**options)))  # type: ignore[arg-type]

    result = CliRunner().invoke(command, ["--tick-seconds", "2.5"])
    assert result.exit_code == 0, result.output
    assert repr(RecalcPolicy(tick_seconds=2.5)) in result.output
    assert "Due rows per tick" in CliRunner().invoke(command, ["--help"]).output
    assert CliRunner().invoke(command, ["--batch-size", "x"]).exit_code == 2


def test_an_unknown_option_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no option"):
        dagster_config(RecalcPolicy, "Bad", names=("batch_size", "nope"))
