"""A tenant's weight at and around its bounds (0.001 to 1000, migration 0044), by every way
one is written: `set_tenant_weight`, `pin tenant set-weight` (a string parsed by click) and
the table's own check, which holds for SQL written by hand."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from pin_orchestration.cli import main
from pin_orchestration.scraping.store.tenancy import (
    MAX_TENANT_WEIGHT,
    MIN_TENANT_WEIGHT,
    TenantError,
    set_tenant_weight,
)

OUTSIDE = [0.0009999999, 1000.0000001, float("nan"), float("inf"), -0.0, 0.0, 5e-324]


def _weight(engine: Engine, name: str) -> float:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT weight FROM scraping.tenants WHERE name = :n"), {"n": name}
        ).scalar_one()


def _pin(db_url: str, *args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"PIN_DATABASE_URL": db_url})


@pytest.mark.parametrize("weight", OUTSIDE, ids=repr)
def test_a_weight_just_outside_the_bounds_is_refused_naming_the_weight_given(
    db_engine: Engine, make_tenant, weight: float
) -> None:
    """0.0009999999 was refused as "(got 0.001)" and 1000.0000001 as "(got 1000)" (`:g`
    rounds to six digits): the message named a weight inside the range it refused."""
    make_tenant("a")
    with pytest.raises(TenantError) as refused:
        set_tenant_weight(db_engine, "a", weight)
    assert f"(got {weight!r})" in str(refused.value)
    assert _weight(db_engine, "a") == 1.0


@pytest.mark.parametrize("weight", [MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT])
def test_the_bounds_themselves_are_accepted(db_engine: Engine, make_tenant, weight: float) -> None:
    make_tenant("a")
    set_tenant_weight(db_engine, "a", weight)
    assert _weight(db_engine, "a") == weight


@pytest.mark.parametrize(
    "literal", ["0.0009999999", "1000.0000001", "'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "0"]
)
def test_the_table_refuses_a_weight_outside_the_bounds_written_by_hand(
    db_engine: Engine, make_tenant, literal: str
) -> None:
    make_tenant("a")
    with pytest.raises(IntegrityError, match="tenants_weight_check"), db_engine.begin() as conn:
        conn.execute(text(f"UPDATE scraping.tenants SET weight = {literal} WHERE name = 'a'"))
    assert _weight(db_engine, "a") == 1.0


@pytest.mark.parametrize(
    ("given", "stored"), [("1e-3", 0.001), ("1E3", 1000.0), ("0.0010000000", 0.001)]
)
def test_pin_tenant_set_weight_parses_the_bounds_in_any_notation(
    db_url: str, db_engine: Engine, make_tenant, given: str, stored: float
) -> None:
    make_tenant("a")
    done = _pin(db_url, "tenant", "set-weight", "a", given)
    assert done.exit_code == 0, done.output
    assert _weight(db_engine, "a") == stored


@pytest.mark.parametrize("given", ["0.0009999999", "1000.0000001", "nan", "inf", "-inf", "-0"])
def test_pin_tenant_set_weight_refuses_a_weight_outside_the_bounds(
    db_url: str, db_engine: Engine, make_tenant, given: str
) -> None:
    make_tenant("a")
    # `--`: "-0" and "-inf" would otherwise be read as options
    done = _pin(db_url, "tenant", "set-weight", "--", "a", given)
    assert done.exit_code != 0
    assert "weight must be between 0.001 and 1000" in done.output
    assert f"(got {float(given)!r})" in done.output, done.output
    assert _weight(db_engine, "a") == 1.0


@pytest.mark.parametrize("weight", [1.0000001, 0.0012345678, 999.9999999, 3.0, MIN_TENANT_WEIGHT])
def test_pin_tenant_list_and_set_weight_print_the_weight_stored(
    db_url: str, db_engine: Engine, make_tenant, weight: float
) -> None:
    """`:g` printed six digits: a weight of 1.0000001 was listed as 1, and an operator
    reading the list could not tell the weight they set from the default."""
    make_tenant("a")
    done = _pin(db_url, "tenant", "set-weight", "a", repr(weight))
    assert done.exit_code == 0, done.output
    shown = repr(weight).removesuffix(".0")
    assert done.output.strip() == f"tenant a: weight {shown}"
    listed = _pin(db_url, "tenant", "list")
    assert listed.exit_code == 0, listed.output
    assert f"\tweight {shown}\t" in listed.output, listed.output
    assert float(shown) == _weight(db_engine, "a")
