"""Fairness by jobs started, whatever is blocked (issue 30, defect 7): a tenant's jobs
waiting on a paused or full domain neither cost it a turn nor bank one. Claimable work
alone decides whose turn it is (docs/jobs/scraping.md, "Scheduling")."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import Engine

from pin_orchestration.scraping.repository import (
    DomainDefaults,
    pause_domain,
    resume_domain,
    set_domain_limits,
)
from tests.scraping.conftest import UNLIMITED
from tests.scraping.test_scheduling import claim, enqueue_many, spread


def _picks(engine: Engine, n: int, defaults: DomainDefaults = UNLIMITED) -> list:
    return [j.tenant_id for j in claim(engine, n, defaults)]


def test_jobs_on_a_paused_domain_do_not_cost_their_tenant_a_turn(
    db_engine: Engine, make_tenant
) -> None:
    a, _ = make_tenant("a")
    b, _ = make_tenant("b")
    pause_domain(db_engine, "paused.example", seconds=600, max_pause_seconds=3600)
    # A's oldest 50 jobs wait on the paused host, then come its 5 claimable ones.
    enqueue_many(db_engine, a.id, [f"http://paused.example/{i}" for i in range(50)])
    enqueue_many(db_engine, a.id, spread("a-open", 5))
    enqueue_many(db_engine, b.id, spread("b", 50))
    first_ten = Counter(_picks(db_engine, 10))
    # Equal weights, both with claimable work: the first ten starts are five each (fair
    # queuing by jobs started; the 50 blocked jobs were never started, so cost nothing).
    assert first_ten[a.id] == 5, first_ten
    assert first_ten[b.id] == 5, first_ten


def test_a_pause_that_starts_after_the_jobs_were_queued_costs_no_turn_either(
    db_engine: Engine, make_tenant
) -> None:
    a, _ = make_tenant("a")
    b, _ = make_tenant("b")
    enqueue_many(db_engine, a.id, [f"http://later-paused.example/{i}" for i in range(50)])
    enqueue_many(db_engine, a.id, spread("a-open", 5))
    enqueue_many(db_engine, b.id, spread("b", 50))
    pause_domain(db_engine, "later-paused.example", seconds=600, max_pause_seconds=3600)
    first_ten = Counter(_picks(db_engine, 10))
    assert first_ten[a.id] == 5, first_ten


def test_a_domain_waking_up_does_not_bank_credit_for_the_time_it_was_paused(
    db_engine: Engine, make_tenant
) -> None:
    a, _ = make_tenant("a")
    b, _ = make_tenant("b")
    pause_domain(db_engine, "paused.example", seconds=600, max_pause_seconds=3600)
    enqueue_many(db_engine, a.id, [f"http://paused.example/{i}" for i in range(50)])
    enqueue_many(db_engine, b.id, spread("b", 200))
    assert set(_picks(db_engine, 40)) == {b.id}  # only B could start
    resume_domain(db_engine, "paused.example")
    # A comes back level with B (its turn at the next pick), not 40 starts ahead.
    after = Counter(_picks(db_engine, 20))
    assert after[a.id] in (9, 10, 11), after


def test_jobs_on_a_full_domain_do_not_cost_their_tenant_a_turn(
    db_engine: Engine, make_tenant
) -> None:
    a, _ = make_tenant("a")
    b, _ = make_tenant("b")
    set_domain_limits(db_engine, "full.example", rps=None, concurrency=1)
    enqueue_many(db_engine, a.id, [f"http://full.example/{i}" for i in range(50)])
    enqueue_many(db_engine, a.id, spread("a-open", 5))
    enqueue_many(db_engine, b.id, spread("b", 50))
    first_twelve = Counter(_picks(db_engine, 12))
    # A starts one job on full.example (its one connection), then its five others: six
    # each over twelve starts.
    assert first_twelve[a.id] == 6, first_twelve
