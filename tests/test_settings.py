"""Settings declared once: the environment readers and docs/configuration.md are derived
from the `setting(…)` declarations; a bad value names its variable, what it accepts and
the default (each variable's own cases: tests/scraping/test_settings.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from pin_orchestration.cli.configuration_doc import with_tables
from pin_orchestration.platform.options import POSITIVE, setting
from pin_orchestration.platform.settings import Settings, SettingsError, read_settings
from pin_orchestration.scraping.settings import ScrapingSettings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"

# Set by `pin up` for the processes it starts, not by an operator (PIN_UP_STACK: the
# marker every process of one stack carries, devstack/up.py), or by a test session or a
# bench for its own (PIN_TEST_SESSION, devstack/processes.py).
NOT_SETTINGS = {"PIN_API_HOST", "PIN_API_PORT", "PIN_UP_STACK", "PIN_TEST_SESSION"}


def test_the_committed_configuration_doc_is_what_the_declarations_produce() -> None:
    committed = DOC.read_text()
    assert with_tables(committed) == committed, (
        "docs/configuration.md is out of date: run "
        "`python -m pin_orchestration.cli.configuration_doc` in the repository root"
    )


def test_every_variable_the_package_names_is_in_the_doc() -> None:
    named = set()
    for path in [*(ROOT / "pin_orchestration").rglob("*.py"), ROOT / "dagster.yaml"]:
        named |= set(re.findall(r"\bPIN_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    documented = DOC.read_text()
    assert sorted(n for n in named - NOT_SETTINGS if f"`{n}`" not in documented) == []


def test_the_readme_points_at_the_doc() -> None:
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()


def test_unset_or_blank_is_the_default_and_the_first_name_set_wins() -> None:
    assert ScrapingSettings.from_env({"PIN_SCRAPING_SLOTS": "  "}) == ScrapingSettings()
    assert Settings.from_env({"PIN_HOME": ""}).home == (Path.cwd() / ".pin").resolve()
    region = {"PIN_S3_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "us-east-1"}
    assert ScrapingSettings.from_env(region).s3_region == "eu-north-1"
    assert ScrapingSettings.from_env({"AWS_DEFAULT_REGION": "us-east-1"}).s3_region == "us-east-1"
    assert Settings.from_env({"PIN_RUN_LOG_LEVEL": "warning"}).run_log_level == "WARNING"
    assert Settings.from_env({"PIN_HOME": "~/x"}).home == Path("~/x").expanduser().resolve()


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("PIN_DATABASE_URL", "mysql://x@y/z", "must be a PostgreSQL SQLAlchemy URL"),
        ("PIN_NEWS_FULL_SWEEP_CRON", "not a cron", "must be a 5-field cron expression"),
        ("PIN_SELECTIONS_URL", "selections:8080", "must be an http(s):// base URL"),
        ("PIN_SNAPSHOT_DETACH_POLLING_SECONDS", "0", "must be seconds > 0"),
        ("PIN_SNAPSHOT_DETACH_POLLING_SECONDS", "soon", "must be seconds > 0"),
        ("PIN_RUN_LOG_LEVEL", "loud", "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ],
)
def test_a_bad_platform_value_names_the_variable_and_the_fix(
    name: str, value: str, says: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"{name} {says}")) as refused:
        Settings.from_env({name: value})
    assert "unset it for the default" in str(refused.value)


def test_an_error_says_what_is_accepted_and_the_default() -> None:
    with pytest.raises(SettingsError) as refused:
        ScrapingSettings.from_env({"PIN_SCRAPING_SLOTS": "many"})
    assert str(refused.value) == (
        "PIN_SCRAPING_SLOTS must be an integer > 0 (got 'many'); unset it for the default: 64"
    )
    with pytest.raises(SettingsError, match="is not a network"):  # the parser's reason
        ScrapingSettings.from_env({"PIN_SCRAPING_ALLOWED_CIDRS": "10.0.0.1/8"})


def test_a_bad_secret_is_refused_without_being_shown() -> None:
    with pytest.raises(SettingsError, match="PIN_DATABASE_URL") as refused:
        Settings.from_env({"PIN_DATABASE_URL": "mysql://pin:hunter2@db/pin"})
    assert "hunter2" not in str(refused.value)
    with pytest.raises(SettingsError, match="PIN_METRICS_TOKEN") as refused:
        ScrapingSettings.from_env({"PIN_METRICS_TOKEN": "hunter2!"})
    assert "hunter2" not in str(refused.value)


@dataclass(frozen=True)
class _Example:
    count: int = setting(3, env="EXAMPLE_COUNT", help="how many", check=POSITIVE)
    ratio: float = setting(0.5, env="EXAMPLE_RATIO", help="how much", unit="a share")
    label: str | None = setting(None, env="EXAMPLE_LABEL", help="what")
    plain: int = 7  # not a setting: never read


def test_any_class_of_settings_is_read_by_its_fields_types() -> None:
    read = read_settings(
        _Example, {"EXAMPLE_COUNT": "4", "EXAMPLE_RATIO": "0.25", "EXAMPLE_LABEL": "x"}
    )
    assert read == _Example(count=4, ratio=0.25, label="x")
    assert read_settings(_Example, {}) == _Example()
    with pytest.raises(SettingsError, match=r"EXAMPLE_RATIO must be a share \(fractions"):
        read_settings(_Example, {"EXAMPLE_RATIO": "nan"})
