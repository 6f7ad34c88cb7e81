"""Migration 0044 on a database with tenants below the new floor: a weight of 1e-300 (or
anything below 0.001) is raised to 0.001, every other weight and every other column of
every tenant is left as it was, and the table refuses a weight below the floor after it;
down lets such a weight in again (raised weights stay raised), and up raises it again."""

from __future__ import annotations

from collections import Counter

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import IntegrityError

from pin_orchestration.migrations import alembic_config

WEIGHTS = {"tiny": 1e-300, "sub": 0.0009999999, "floor": 0.001, "one": 1.0, "top": 1000.0}


def _tenants(engine: Engine) -> dict[str, dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM scraping.tenants")).mappings().all()
    return {r["name"]: dict(r) for r in rows}


def _insert(engine: Engine, name: str, weight: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix, weight)"
                " VALUES (gen_random_uuid(), :n, sha256(convert_to(:n, 'UTF8')), :n, :w)"
            ),
            {"n": name, "w": weight},
        )


def test_0044_raises_weights_below_the_floor_and_nothing_else(empty_db_url: str) -> None:
    config = alembic_config(empty_db_url)
    command.upgrade(config, "0043")
    engine = create_engine(empty_db_url)
    try:
        for name, weight in WEIGHTS.items():
            _insert(engine, name, weight)
        before = _tenants(engine)

        command.upgrade(config, "0044")
        after = _tenants(engine)
        raised = {"tiny": 0.001, "sub": 0.001}
        assert {n: t["weight"] for n, t in after.items()} == {**WEIGHTS, **raised}
        for name, row in after.items():
            assert {**row, "weight": None} == {**before[name], "weight": None}, name
        with pytest.raises(IntegrityError, match="tenants_weight_check"):
            _insert(engine, "new-tiny", 1e-300)

        command.downgrade(config, "0043")
        assert {n: t["weight"] for n, t in _tenants(engine).items()} == {**WEIGHTS, **raised}
        _insert(engine, "again", 1e-300)
        command.upgrade(config, "0044")
        assert _tenants(engine)["again"]["weight"] == 0.001
    finally:
        engine.dispose()


def test_0044_leaves_the_others_their_turns_after_a_tiny_weight_has_run(
    empty_db_url: str,
) -> None:
    """At 0043 a tenant of weight 1e-300 starts 3 jobs while b and c wait on a paused host:
    its tag and the class start clock reach ~1e300, where a weight-1 step of 1 is lost in a
    double. 0044 raises the weight but leaves those clocks; 0046 makes the start tags
    numeric (carrying them exactly), so b and c, back at the clock, share the picks."""
    from pin_orchestration.scraping.store.politeness import resume_domain
    from pin_orchestration.scraping.store.tenancy import create_tenant
    from tests.scraping.test_fairness_blocked import PAUSED, _claim, _enqueue, _pause

    config = alembic_config(empty_db_url)
    command.upgrade(config, "0043")
    engine = create_engine(empty_db_url)
    try:
        a, b, c = (create_tenant(engine, name)[0].id for name in ("a", "b", "c"))
        with engine.begin() as conn:
            conn.execute(text("UPDATE scraping.tenants SET weight = 1e-300 WHERE name = 'a'"))
        _pause(engine)
        _enqueue(engine, b, [f"http://{PAUSED}/b{i}" for i in range(20)])
        _enqueue(engine, c, [f"http://{PAUSED}/c{i}" for i in range(20)])
        _enqueue(engine, a, [f"http://a-{i}.example/{i}" for i in range(3)])
        assert Counter(j.tenant_id for j in _claim(engine, 3)) == {a: 3}

        command.upgrade(config, "0044")
        command.upgrade(config, "0046")
        assert resume_domain(engine, PAUSED)
        woken = Counter(j.tenant_id for j in _claim(engine, 10))
        assert woken[b] + woken[c] == 10 and abs(woken[b] - woken[c]) <= 2, woken
    finally:
        engine.dispose()
