"""An option set declared once: the Dagster config and the click options derived from it
carry the dataclass's defaults and help, and nothing else."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from pin_orchestration.chessboard.queue import DRAIN_RUN_OPTIONS, RecalcPolicy
from pin_orchestration.platform.options import click_options, dagster_config


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


def test_a_worker_run_config_takes_the_worker_options_and_the_settings_they_take_over() -> None:
    from pin_orchestration.jobs.scraping import WorkerRunConfig
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.worker.options import WORKER_RUN_OPTIONS, WorkerOptions

    fields = WorkerRunConfig.model_fields  # type: ignore[attr-defined]
    assert list(fields) == list(WORKER_RUN_OPTIONS)
    defaults = WorkerOptions()
    assert fields["idle_exit_seconds"].default == defaults.idle_exit_seconds
    assert fields["max_run_duration_seconds"].default == defaults.max_run_duration_seconds
    # A setting (declared once, in ScrapingSettings): empty in run config is its variable.
    assert defaults.slots == ScrapingSettings().slots
    assert fields["slots"].default is None
    assert "PIN_SCRAPING_SLOTS" in fields["slots"].description
    settings = ScrapingSettings(slots=3, lease_seconds=7.0)
    options = WorkerRunConfig(idle_exit_seconds=1.0).to_options(settings)  # type: ignore[call-arg]
    assert (options.slots, options.lease_seconds, options.idle_exit_seconds) == (3, 7.0, 1.0)
    assert WorkerRunConfig(slots=5).to_options(settings).slots == 5  # type: ignore[call-arg]


def test_a_setting_taken_over_is_empty_on_the_command_line_unless_given() -> None:
    from pin_orchestration.scraping.settings import ScrapingSettings
    from pin_orchestration.scraping.worker.options import WORKER_RUN_OPTIONS, WorkerOptions

    @click.command()
    @click_options(WorkerOptions, WORKER_RUN_OPTIONS)
    def command(**given: object) -> None:
        click.echo(WorkerOptions.from_settings(ScrapingSettings(slots=3), **given).slots)

    assert CliRunner().invoke(command, []).output.strip() == "3"
    assert CliRunner().invoke(command, ["--slots", "9"]).output.strip() == "9"
    assert "PIN_SCRAPING_SLOTS" in CliRunner().invoke(command, ["--help"]).output
