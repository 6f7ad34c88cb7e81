"""Chessboard recalc (seed 002): a stream of source changes, each raising its project's recalc
in its own transaction (`request_project_recalc`), drained by `drain_loop` processes into
aggregates and outbox rows that `run_publisher` processes deliver to Kafka (librdkafka's
mock cluster behind a FaultProxy, see faults.kafka). Faults: drains SIGKILLed, publishers
SIGKILLed, Kafka cut / hung / reset mid-publish, PostgreSQL restarted mid-drain, the
injected clock jumping under raisers and drains.

Invariants, against records the job does not keep itself:
- `recalc.aggregates_match_source`: after the queue drained, every stored aggregate equals
  the source of truth, computed here in Python from the source rows (and the runbook's
  divergence check agrees);
- `recalc.event_reached_kafka`: the topics, read back with a consumer, hold every outbox
  event and the final version of every row a recalc changed, at least once;
- `recalc.version_order_per_key`: per key, each version seen for the first time is higher
  than every version before it in partition order; a version seen again is a redelivery;
- `recalc.one_drain_per_claim` (scenarios without a clock jump): no drain claims a row
  within the lease of another drain's unfinished claim on it — from a log of claims a
  trigger in the scenario's database keeps (the server's clock_timestamp()), not from
  the lease column the claim itself compares.

`recalc-drain-sigkill` also raises a project again while a drain is held inside its
recalc (a gate the scenario closes): that request must get a recalc of its own
(`aggregates_match_source`), and the other drain must not take the held row.

"One recalc per claimed request" is not checked beyond that: a recalc that finds nothing
to change writes nothing, so a second recalc of the same claim (after a lease expired
under a killed or clock-jumped drain) leaves no trace outside the drains' own logs, and by
design it is harmless (the project row lock serialises the two; the second finds no
difference).

Run as `python -m faults.scenarios.recalc drain URL CLOCK SECONDS` or
`… publish URL BOOTSTRAP SECONDS` it is one drain or one publisher process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from faults.clock import JumpingClock
from faults.core import FaultContext, Outcome, scenario, wait_until
from faults.kafka import MockKafka, TopicMessage
from pin_orchestration.chessboard.queue import RecalcPolicy, request_project_recalc

log = logging.getLogger(__name__)

# Seconds, not the seed's 30 s / 5 min: the suite waits for every request to fall due.
RAISE_POLICY = RecalcPolicy(debounce_seconds=0.2, starvation_cap_seconds=1.0)
# A lease of 2 s: a killed drain's rows are taken over within the scenario.
DRAIN_POLICY = RecalcPolicy(
    batch_size=20, tick_seconds=0.5, floor_seconds=0.05, claim_lease_seconds=2.0
)
PUBLISHER_LOCK_TTL_SECONDS = 2.0
MESSAGE_TIMEOUT_MS = 2_000
FAST_RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200}
TOPICS = {
    "project": "pin.chessboard.project-upserted.v1",
    "layout": "pin.chessboard.layout-upserted.v1",
    "layout_group": "pin.chessboard.layout-group-upserted.v1",
}
STATUSES = ("Free", "Free", "Booked", "Sold", "Hidden")
CHILD_LIFETIME_SECONDS = 900.0  # an upper bound: the scenario kills its children sooner


# -- the processes the scenarios start and kill ------------------------------------------
def run_drain(database_url: str, clock_file: str, seconds: float) -> None:
    """A drain worker: `drain_loop` passes; a failure (the database restarting) ends the
    loop and the next one starts, as the sensor launches another drain run."""
    from pin_orchestration.chessboard.drain import drain_loop
    from pin_orchestration.platform.db import create_db_engine

    engine = create_db_engine(database_url)
    clock = JumpingClock(Path(clock_file)) if clock_file != "-" else None
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            drain_loop(
                engine,
                stop,
                policy=DRAIN_POLICY,
                deadline=deadline,
                db_now=clock.now if clock else lambda: None,
            )
        except Exception:
            log.exception("drain loop failed; starting again")
            stop.wait(0.2)


def run_publish(database_url: str, bootstrap: str, seconds: float) -> None:
    """An outbox publisher (`run_publisher`) with a short lock TTL, so a killed one's lock
    passes within the scenario; restarted after a failure, as a supervisor would."""
    from pin_orchestration.chessboard.outbox.publisher import KafkaSink, run_publisher
    from pin_orchestration.platform.db import create_db_engine

    engine = create_db_engine(database_url)
    sink = KafkaSink(bootstrap, message_timeout_ms=MESSAGE_TIMEOUT_MS, extra_config=FAST_RECONNECT)
    stop = threading.Event()
    lifetime = threading.Timer(seconds, stop.set)
    lifetime.daemon = True
    lifetime.start()
    while not stop.is_set():
        try:
            run_publisher(
                engine,
                sink,
                stop=stop,
                holder=f"faults-publisher-{os.getpid()}",
                poll_interval_seconds=0.1,
                lock_ttl_seconds=PUBLISHER_LOCK_TTL_SECONDS,
                batch_size=20,
            )
        except Exception:
            log.exception("publisher failed; starting again")
            stop.wait(0.2)


# -- the world and the stream of changes ------------------------------------------------
@dataclass
class Project:
    id: uuid.UUID
    tenant_id: uuid.UUID
    buildings: list[uuid.UUID]
    layouts: list[uuid.UUID]
    objects: list[uuid.UUID]


def _price(rng: random.Random) -> Decimal:
    return Decimal(rng.randrange(5_000, 50_000)) * 1000


def build_world(engine: Engine, rng: random.Random, projects: int) -> list[Project]:
    """Projects with buildings, layout groups, layouts and objects; aggregates left at
    their defaults, so the first recalc of each has work to do."""
    world: list[Project] = []
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(projects):
        p = Project(uuid.uuid4(), uuid.uuid4(), [], [], [])
        rows["projects"].append({"id": p.id, "tenant_id": p.tenant_id, "status": "Published"})
        p.buildings = [uuid.uuid4() for _ in range(2)]
        groups = [uuid.uuid4() for _ in range(2)]
        p.layouts = [uuid.uuid4() for _ in range(4)]
        rows["buildings"] += [{"id": b, "project_id": p.id} for b in p.buildings]
        rows["layout_groups"] += [{"id": g, "project_id": p.id} for g in groups]
        rows["layouts"] += [
            {"id": lid, "project_id": p.id, "layout_group_id": groups[i % 2], "total_area": a}
            for i, lid in enumerate(p.layouts)
            for a in [Decimal(rng.randrange(2_000, 12_000)) / 100]
        ]
        for _ in range(8):
            p.objects.append(uuid.uuid4())
            rows["property_objects"].append(_new_object(rng, p, p.objects[-1]))
        world.append(p)
    with engine.begin() as conn:
        for table, values in rows.items():
            columns = list(values[0])
            conn.execute(
                text(
                    f"INSERT INTO chessboard.{table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join(':' + c for c in columns)})"
                ),
                values,
            )
    return world


def _new_object(rng: random.Random, p: Project, object_id: uuid.UUID) -> dict[str, Any]:
    return {
        "id": object_id,
        "project_id": p.id,
        "building_id": rng.choice(p.buildings),
        "layout_id": rng.choice(p.layouts),
        "status": rng.choice(STATUSES),
        "price": _price(rng),
    }


def apply_change(
    conn: Connection, rng: random.Random, p: Project, now: datetime | None = None
) -> None:
    """One source change of project `p` and its recalc request, in the caller's
    transaction (what every raiser does)."""
    kind = rng.choice(["status", "status", "price", "delete", "insert", "layout", "layout"])
    target = rng.choice(p.objects)
    if kind == "status":
        sql = "UPDATE chessboard.property_objects SET status = :v WHERE id = :id"
        params: dict[str, Any] = {"id": target, "v": rng.choice(STATUSES)}
    elif kind == "price":
        sql = "UPDATE chessboard.property_objects SET price = :v WHERE id = :id"
        params = {"id": target, "v": _price(rng)}
    elif kind == "delete":  # soft delete, or bring back
        sql = (
            "UPDATE chessboard.property_objects "
            "SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END WHERE id = :id"
        )
        params = {"id": target}
    elif kind == "insert":
        sql = (
            "INSERT INTO chessboard.property_objects "
            "(id, project_id, building_id, layout_id, status, price) "
            "VALUES (:id, :project_id, :building_id, :layout_id, :status, :price)"
        )
        params = _new_object(rng, p, uuid.uuid4())
    else:  # a layout's area changes, or it is deleted / restored
        layout = rng.choice(p.layouts)
        if rng.random() < 0.7:
            sql = "UPDATE chessboard.layouts SET total_area = :v WHERE id = :id"
            params = {"id": layout, "v": Decimal(rng.randrange(2_000, 12_000)) / 100}
        else:
            sql = (
                "UPDATE chessboard.layouts "
                "SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END WHERE id = :id"
            )
            params = {"id": layout}
    conn.execute(text(sql), params)
    request_project_recalc(conn, p.id, p.tenant_id, "Crud", now=now, policy=RAISE_POLICY)
    if kind == "insert":
        p.objects.append(params["id"])


class ChangeStream(threading.Thread):
    """`count` changes spread over `seconds`, each retried until it commits (a raiser's
    transaction that fails while the database restarts is simply run again)."""

    def __init__(
        self,
        engine: Engine,
        world: list[Project],
        *,
        seed: int,
        count: int,
        seconds: float,
        clock: JumpingClock | None = None,
    ) -> None:
        super().__init__(daemon=True, name="recalc-changes")
        self.engine, self.world, self.count, self.clock = engine, world, count, clock
        self.rng = random.Random(seed)
        self.pause = seconds / count
        self.committed = 0
        self.retries = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while self.committed < self.count and not self._halt.is_set():
            p = self.rng.choice(self.world)
            state = self.rng.getstate()
            try:
                with self.engine.begin() as conn:
                    apply_change(conn, self.rng, p, self.clock.now() if self.clock else None)
            except Exception:
                self.retries += 1
                self.rng.setstate(state)  # the same change again
                self._halt.wait(0.1)
                continue
            self.committed += 1
            self._halt.wait(self.pause)  # the pace of the stream, not a wait for anything

    def finish(self, timeout: float) -> None:
        self.join(timeout)
        self._halt.set()
        self.join()


# -- the claim log and the gate (in the scenario's private database) --------------------
GATE_LOCK = 2_020_002
_CLAIM_LOG = """
CREATE TABLE public.faults_claims (
    token uuid PRIMARY KEY, project_id uuid NOT NULL, claimed_at timestamptz NOT NULL,
    replaced_token uuid, replaced_claimed_at timestamptz
);
CREATE FUNCTION public.faults_log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token THEN
        INSERT INTO public.faults_claims
        SELECT NEW.claim_token, NEW.project_id, clock_timestamp(), OLD.claim_token,
               (SELECT c.claimed_at FROM public.faults_claims AS c
                WHERE c.token = OLD.claim_token);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER faults_log_claim AFTER UPDATE ON chessboard.project_recalc_requests
FOR EACH ROW EXECUTE FUNCTION public.faults_log_claim();
-- The gate: a recalc updating a gated project waits while the scenario holds GATE_LOCK.
CREATE TABLE public.faults_gated (project_id uuid PRIMARY KEY);
CREATE FUNCTION public.faults_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM public.faults_gated WHERE project_id = NEW.id) THEN
        PERFORM pg_advisory_lock_shared(%(gate)s);
        PERFORM pg_advisory_unlock_shared(%(gate)s);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER faults_gate BEFORE UPDATE ON chessboard.projects
FOR EACH ROW EXECUTE FUNCTION public.faults_gate();
"""


def install_claim_log_and_gate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(_CLAIM_LOG % {"gate": GATE_LOCK})


def claims_within_a_lease(conn: Connection) -> list[str]:
    """Claims that replaced another drain's unfinished claim before its lease could have
    run out (a killed drain's row is taken over only after it)."""
    rows = conn.execute(
        text(
            "SELECT project_id, extract(epoch FROM claimed_at - replaced_claimed_at) AS after "
            "FROM public.faults_claims "
            "WHERE replaced_claimed_at > claimed_at - make_interval(secs => :lease)"
        ),
        # clock_timestamp() in the trigger runs a little after the claim's now(), from
        # which the lease counts: a margin keeps a takeover just at expiry legitimate.
        {"lease": DRAIN_POLICY.claim_lease_seconds - 0.1},
    )
    return [f"{r.project_id} claimed again {float(r.after):.3f} s into a lease" for r in rows]


def _insert_free_object(conn: Connection, rng: random.Random, p: Project) -> None:
    """A change that always moves the project's counters (one more free object), raised."""
    params = {**_new_object(rng, p, uuid.uuid4()), "status": "Free"}
    conn.execute(
        text(
            "INSERT INTO chessboard.property_objects "
            "(id, project_id, building_id, layout_id, status, price) "
            "VALUES (:id, :project_id, :building_id, :layout_id, :status, :price)"
        ),
        params,
    )
    request_project_recalc(conn, p.id, p.tenant_id, "Crud", policy=RAISE_POLICY)


# -- the record read back, and the invariants -------------------------------------------
def _truth(conn: Connection) -> dict[tuple[str, uuid.UUID], dict[str, Any]]:
    """Every aggregate as the seed's formulas give it from the source rows (AGG-4),
    computed here rather than by the job's SQL."""
    truth: dict[tuple[str, uuid.UUID], dict[str, Any]] = {}
    for table, entity in [("projects", "project"), ("buildings", "building")]:
        for (id_,) in conn.execute(text(f"SELECT id FROM chessboard.{table}")):
            truth[(entity, id_)] = {"total": 0, "free": 0, "prices": []}
    layouts = conn.execute(
        text("SELECT id, layout_group_id, total_area, deleted_at FROM chessboard.layouts")
    ).all()
    for lay in layouts:
        truth[("layout", lay.id)] = {"count": 0}
    for (id_,) in conn.execute(text("SELECT id FROM chessboard.layout_groups")):
        truth[("layout_group", id_)] = {"count": 0, "areas": []}
    objects = conn.execute(
        text(
            "SELECT project_id, building_id, layout_id, status, price "
            "FROM chessboard.property_objects WHERE deleted_at IS NULL"
        )
    )
    for o in objects:
        active, free = o.status != "Hidden", o.status == "Free"
        for key in [("project", o.project_id), ("building", o.building_id)]:
            if key in truth:
                truth[key]["total"] += active
                truth[key]["free"] += free
                if free and key[0] == "project":
                    truth[key]["prices"].append(o.price)
        if active and ("layout", o.layout_id) in truth:
            truth[("layout", o.layout_id)]["count"] += 1
    for lay in layouts:
        if lay.deleted_at is None and ("layout_group", lay.layout_group_id) in truth:
            group = truth[("layout_group", lay.layout_group_id)]
            group["count"] += 1
            group["areas"].append(lay.total_area)
    expected: dict[tuple[str, uuid.UUID], dict[str, Any]] = {}
    for (entity, id_), t in truth.items():
        if entity == "project":
            prices = t["prices"]
            expected[(entity, id_)] = {
                "price_min": min(prices, default=None),
                "price_max": max(prices, default=None),
                "property_objects_total_count": t["total"],
                "property_objects_free_count": t["free"],
            }
        elif entity == "building":
            expected[(entity, id_)] = {
                "property_objects_total_count": t["total"],
                "property_objects_free_count": t["free"],
            }
        elif entity == "layout":
            expected[(entity, id_)] = {"property_objects_count": t["count"]}
        else:
            areas = [a for a in t["areas"] if a is not None]
            expected[(entity, id_)] = {
                "layouts_count": t["count"],
                "area_min": min(areas, default=None),
                "area_max": max(areas, default=None),
            }
    return expected


def diverged_aggregates(conn: Connection) -> list[str]:
    from pin_orchestration.chessboard.recalc import find_divergence

    tables = {
        "project": "projects",
        "building": "buildings",
        "layout": "layouts",
        "layout_group": "layout_groups",
    }
    found = []
    for (entity, id_), want in _truth(conn).items():
        columns = ", ".join(want)
        stored = conn.execute(
            text(f"SELECT {columns} FROM chessboard.{tables[entity]} WHERE id = :id"),
            {"id": id_},
        ).one()
        if dict(stored._mapping) != want:
            found.append(f"{entity} {id_}: stored {dict(stored._mapping)}, truth {want}")
    # The runbook's divergence check must see the same (nothing): a second opinion.
    for (project_id,) in conn.execute(text("SELECT id FROM chessboard.projects")):
        found += [
            f"runbook: {d.entity} {d.id}: {d.stored} vs {d.truth}"
            for d in find_divergence(conn, project_id)
        ]
    return found


def missing_events(conn: Connection, on_topic: set[tuple[str, str, int]]) -> list[str]:
    """Events that should be on the topics and are not: every outbox row (what the recalcs
    promised) and the current version of every row a recalc changed (version > 1)."""
    wanted = {
        (r.topic, str(r.entity_id), r.version)
        for r in conn.execute(text("SELECT topic, entity_id, version FROM chessboard.event_outbox"))
    }
    for entity, table in [("project", "projects"), ("layout", "layouts")] + [
        ("layout_group", "layout_groups")
    ]:
        rows = conn.execute(text(f"SELECT id, version FROM chessboard.{table} WHERE version > 1"))
        wanted |= {(TOPICS[entity], str(r.id), r.version) for r in rows}
    return sorted(f"{t} key {k} version {v}" for t, k, v in wanted - on_topic)


def version_order(messages: list[TopicMessage]) -> tuple[list[str], int]:
    """(versions that went backwards, redeliveries) per key in partition order."""
    seen: dict[tuple[str, str], set[int]] = defaultdict(set)
    backwards: list[str] = []
    redeliveries = 0
    for m in messages:
        key, version = (m.topic, m.key), int(m.headers["version"])
        if version in seen[key]:
            redeliveries += 1
        elif seen[key] and version < max(seen[key]):
            backwards.append(f"{m.topic} key {m.key}: {version} after {max(seen[key])}")
        seen[key].add(version)
    return backwards, redeliveries


# -- the rig every scenario shares ------------------------------------------------------
@dataclass
class Rig:
    ctx: FaultContext
    url: str
    engine: Engine
    kafka: MockKafka
    world: list[Project] = field(default_factory=list)
    clock: JumpingClock | None = None
    drains: list[subprocess.Popen[bytes]] = field(default_factory=list)
    publishers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn_drain(self) -> None:
        clock = str(self.clock.path) if self.clock else "-"
        args = ["-m", __name__, "drain", self.url, clock, str(CHILD_LIFETIME_SECONDS)]
        name = f"drain{len(self.drains)}"
        self.drains.append(self.ctx.spawn(args, self.ctx.pin_env(self.url), name=name))

    def spawn_publisher(self) -> None:
        args = ["-m", __name__, "publish", self.url, self.kafka.bootstrap]
        name = f"publisher{len(self.publishers)}"
        self.publishers.append(
            self.ctx.spawn(
                [*args, str(CHILD_LIFETIME_SECONDS)], self.ctx.pin_env(self.url), name=name
            )
        )

    def alive(self, children: list[subprocess.Popen[bytes]]) -> list[subprocess.Popen[bytes]]:
        return [c for c in children if c.poll() is None]

    def db_now(self) -> datetime:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT now()")).scalar_one()

    def due_by(self, moment: datetime) -> int:
        """Queue rows due at `moment` that are still there (raised again later: not)."""
        with self.engine.connect() as conn:
            return conn.execute(
                text("SELECT count(*) FROM chessboard.project_recalc_requests WHERE due_at <= :t"),
                {"t": moment},
            ).scalar_one()

    def unpublished_ids(self) -> set[int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id FROM chessboard.event_outbox WHERE published_at IS NULL")
            )
            return {r.id for r in rows}

    def published(self, ids: set[int]) -> bool:
        return not (ids & self.unpublished_ids())

    def recovered_when_drained(self, outcome: Outcome, moment: datetime, what: str) -> None:
        """The recovery after a fault: until every request due by `moment` is drained."""
        outcome.recovered_after(wait_until(lambda: self.due_by(moment) == 0, timeout=60, what=what))

    def recovered_when_published(self, outcome: Outcome, ids: set[int], what: str) -> None:
        """The recovery after a fault: until the events pending at it are delivered. The
        bound is 60 s: a publisher started at a hang on a loaded machine had its first
        Kafka request unanswered for librdkafka's 30 s socket timeout (22:41, a full
        suite beside), then delivered on its next connection; the recovery time is
        reported either way."""
        outcome.recovered_after(wait_until(lambda: self.published(ids), timeout=60, what=what))

    def queue_depth(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(
                text("SELECT count(*) FROM chessboard.project_recalc_requests")
            ).scalar_one()


Inject = Callable[[Rig, Outcome], None]


def _run(
    ctx: FaultContext,
    fault: str,
    inject: Inject,
    *,
    drains: int = 2,
    clock: bool = False,
) -> Outcome:
    from pin_orchestration.platform.db import create_db_engine

    outcome = Outcome(job="recalc", fault=fault)
    url = ctx.postgres.create_database("recalc")
    engine = create_db_engine(url)
    try:
        with contextlib.closing(MockKafka()) as kafka:
            rig = Rig(ctx, url, engine, kafka)
            if clock:
                rig.clock = JumpingClock(ctx.workdir / "clock-offset")
            rig.world = world = build_world(engine, ctx.rng, ctx.scale(30, 60))
            install_claim_log_and_gate(engine)
            for _ in range(drains):
                rig.spawn_drain()
            rig.spawn_publisher()
            stream = ChangeStream(
                engine,
                world,
                seed=ctx.rng.randrange(2**32),
                count=ctx.scale(200, 1000),
                seconds=ctx.scale(5, 25),
                clock=rig.clock,
            )
            stream.start()
            try:
                inject(rig, outcome)
            finally:
                stream.finish(timeout=120)
            outcome.operations = stream.committed
            _settle(rig)
            ctx.stop_children()
            _check(rig, outcome)
    finally:
        ctx.stop_children()  # before the broker goes: nothing left talking to it
        engine.dispose()
    return outcome


def _settle(rig: Rig) -> None:
    """Let the job finish what was promised: the queue empty, the outbox delivered. A
    timeout is no error here: the checks below then name what was lost."""
    if not rig.alive(rig.drains):
        rig.spawn_drain()
    if not rig.alive(rig.publishers):
        rig.spawn_publisher()
    try:
        wait_until(lambda: rig.queue_depth() == 0, timeout=60, what="the queue drained")
        wait_until(lambda: not rig.unpublished_ids(), timeout=60, what="the outbox delivered")
    except TimeoutError as exc:
        log.warning("%s", exc)


def _check(rig: Rig, outcome: Outcome) -> None:
    with rig.engine.connect() as conn:
        depth = rig.queue_depth()
        diverged = diverged_aggregates(conn)
        messages = rig.kafka.read_topics(list(TOPICS.values()))
        on_topic = {(m.topic, m.key, int(m.headers["version"])) for m in messages}
        missing = missing_events(conn, on_topic)
        taken_twice = claims_within_a_lease(conn)
    outcome.lost = len(diverged) + len(missing)
    outcome.check(
        "aggregates_match_source",
        not diverged and depth == 0,
        f"{depth} requests still queued; {len(diverged)} diverged: {diverged[:3]}",
    )
    outcome.check(
        "event_reached_kafka",
        not missing,
        f"{len(missing)} of {len(on_topic)} events not on the topics: {missing[:3]}",
    )
    backwards, outcome.redeliveries = version_order(messages)
    outcome.check(
        "version_order_per_key",
        not backwards,
        f"{len(backwards)} versions out of order: {backwards[:3]}",
    )
    if rig.clock is None:  # a jumped drain's clock expires leases early, by design
        outcome.duplicated = len(taken_twice)
        outcome.check(
            "one_drain_per_claim",
            not taken_twice,
            f"{len(taken_twice)} rows claimed inside another drain's lease: {taken_twice[:3]}",
        )


# -- the scenarios ----------------------------------------------------------------------
def _pause(rig: Rig) -> None:
    """A random moment of the stream: when the next fault strikes."""
    time.sleep(rig.ctx.rng.uniform(0.3, 1.2))


def kill_drains(rig: Rig, outcome: Outcome) -> None:
    for _ in range(rig.ctx.scale(2, 10)):
        _pause(rig)
        victim = rig.ctx.rng.choice(rig.alive(rig.drains))
        fault_at = rig.db_now()
        rig.ctx.sigkill(victim)
        outcome.faults_injected += 1
        rig.spawn_drain()
        rig.recovered_when_drained(outcome, fault_at, "the requests due at a drain's kill drained")


def raise_during_a_recalc(rig: Rig, outcome: Outcome) -> None:
    """A project (of its own: the stream never touches it) is raised, a drain takes it and
    is held at the gate inside the recalc, holding the claim; the project is changed and
    raised again; the gate opens a tick later. That last change must get a recalc of its
    own, and the other drain, awake meanwhile, must not claim the held row."""
    [p] = build_world(rig.engine, rig.ctx.rng, 1)
    with rig.engine.begin() as conn:
        conn.execute(text("INSERT INTO public.faults_gated VALUES (:p)"), {"p": p.id})
    with rig.engine.connect() as gate:
        gate.execute(text("SELECT pg_advisory_lock(:k)"), {"k": GATE_LOCK})
        gate.commit()
        try:
            with rig.engine.begin() as conn:
                _insert_free_object(conn, rig.ctx.rng, p)
            wait_until(
                lambda: _waiting_at_the_gate(rig.engine),
                timeout=30,
                what="a drain held inside the gated project's recalc",
            )
            with rig.engine.begin() as conn:
                _insert_free_object(conn, rig.ctx.rng, p)
            outcome.faults_injected += 1
            # Long enough for the other drain to wake and claim (at most a tick), well
            # inside the held drain's lease.
            time.sleep(2 * DRAIN_POLICY.tick_seconds)
        finally:
            gate.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": GATE_LOCK})
            gate.commit()
    rig.recovered_when_drained(
        outcome, rig.db_now(), "the request raised during a held recalc drained"
    )


def _waiting_at_the_gate(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
                )
            ).scalar_one()
        )


def kill_drains_and_raise_during_a_recalc(rig: Rig, outcome: Outcome) -> None:
    kill_drains(rig, outcome)
    raise_during_a_recalc(rig, outcome)


def kill_publishers(rig: Rig, outcome: Outcome) -> None:
    for _ in range(rig.ctx.scale(2, 10)):
        _pause(rig)
        for victim in rig.alive(rig.publishers):
            rig.ctx.sigkill(victim)
        pending = rig.unpublished_ids()
        outcome.faults_injected += 1
        rig.spawn_publisher()
        rig.recovered_when_published(
            outcome, pending, "the events pending at a publisher's kill delivered"
        )


def cut_kafka(rig: Rig, outcome: Outcome) -> None:
    """Kafka refused, hung and reset in turn. Under the first cut, with events in flight
    that cannot be acknowledged, the publisher is also killed: a publisher that marked
    them published before the acknowledgement has lost them then and there."""
    modes = ["down", "reset", "hang"] * rig.ctx.scale(1, 3)
    for number, mode in enumerate(modes[: rig.ctx.scale(2, 9)]):
        _pause(rig)
        proxy = rig.kafka.proxy
        if mode == "reset":
            proxy.set_mode("reset")  # the live connections and the reconnects alike
            proxy.reset_all()
            _pause(rig)
        else:
            proxy.set_mode(mode)
            _events_in_flight(rig)
            if number == 0:
                for victim in rig.alive(rig.publishers):
                    rig.ctx.sigkill(victim)
                rig.spawn_publisher()
        pending = rig.unpublished_ids()
        proxy.set_mode("pass")
        outcome.faults_injected += 1
        rig.recovered_when_published(
            outcome, pending, f"the events pending when Kafka came back ({mode}) delivered"
        )


def _events_in_flight(rig: Rig) -> None:
    """Raise changes until a publisher has taken events into a round that began after the
    cut: it marked them published (after the cut), or counted a failed attempt on an
    event written after the cut, or a second one since the cut on an older event (the
    publisher reads the oldest first, so a backlog keeps newer events out of every round).
    None of such a round's messages can have reached the broker. One failed attempt on an
    older event is not enough: it may be the round in flight at the cut, whose messages
    may have been appended before the reset (the acknowledgement lost), and taking that
    round for the one the kill must interrupt let a publisher that marks before the
    acknowledgement lose nothing, one run in five."""
    cut_at = rig.db_now()
    project = rig.world[0]
    with rig.engine.connect() as conn:
        attempts_at_cut = dict(
            conn.execute(
                text(
                    "SELECT id, publish_attempts FROM chessboard.event_outbox"
                    " WHERE published_at IS NULL"
                )
            ).all()
        )

    def taken() -> bool:
        with rig.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, publish_attempts, published_at > :t AS marked,"
                    " created_at > :t AS written_after"
                    " FROM chessboard.event_outbox"
                    " WHERE publish_attempts > 0 OR published_at > :t"
                ),
                {"t": cut_at},
            ).tuples()
            return any(
                marked
                or (written_after and attempts > 0)
                or (id_ in attempts_at_cut and attempts - attempts_at_cut[id_] >= 2)
                for id_, attempts, marked, written_after in rows
            )

    def raise_and_look() -> bool:
        with rig.engine.begin() as conn:
            apply_change(conn, rig.ctx.rng, project, rig.clock.now() if rig.clock else None)
        return taken()

    wait_until(raise_and_look, timeout=30, every=0.5, what="events in a round while Kafka is cut")


def restart_postgres(rig: Rig, outcome: Outcome) -> None:
    for _ in range(rig.ctx.scale(1, 4)):
        _pause(rig)
        fault_at = rig.db_now()
        rig.ctx.postgres.restart(down_seconds=rig.ctx.rng.uniform(0.0, 1.0))
        outcome.faults_injected += 1
        rig.recovered_when_drained(outcome, fault_at, "the requests due at the restart drained")


def jump_clock(rig: Rig, outcome: Outcome) -> None:
    """The clock of raisers and drains jumps back a few seconds (requests raised before
    fall due that much later, leases last that much longer), then forward an hour
    (debounce windows and leases expire at once: a leased row may be recalculated twice,
    never lost). Back first: a backward jump after the hour ahead would strand the
    requests raised in it for the hour (a real property of any due-time queue)."""
    clock = rig.clock
    assert clock is not None
    for seconds in [-rig.ctx.scale(3.0, 8.0), 3600.0] * rig.ctx.scale(1, 3):
        _pause(rig)
        before = clock.now()
        clock.jump(seconds)
        outcome.faults_injected += 1
        # Every request raised before the jump, on either side of it, drained.
        moment = max(before, clock.now()) + timedelta(seconds=RAISE_POLICY.debounce_seconds)
        rig.recovered_when_drained(
            outcome, moment, f"the requests raised before a clock jump of {seconds:+.0f} s drained"
        )


@scenario("recalc-drain-sigkill", job="recalc", fault="SIGKILL of a drain")
def drains_killed(ctx: FaultContext) -> Outcome:
    return _run(ctx, "SIGKILL of a drain", kill_drains_and_raise_during_a_recalc)


@scenario("recalc-publisher-sigkill", job="recalc", fault="SIGKILL of the publisher")
def publishers_killed(ctx: FaultContext) -> Outcome:
    return _run(ctx, "SIGKILL of the publisher", kill_publishers, drains=1)


@scenario("recalc-kafka-outage", job="recalc", fault="Kafka down, hung, reset")
def kafka_cut(ctx: FaultContext) -> Outcome:
    return _run(ctx, "Kafka down, hung, reset", cut_kafka, drains=1)


@scenario("recalc-pg-restart", job="recalc", fault="PostgreSQL restarted")
def database_restarted(ctx: FaultContext) -> Outcome:
    return _run(ctx, "PostgreSQL restarted", restart_postgres)


@scenario("recalc-clock-jump", job="recalc", fault="clock jumps back and ahead")
def clock_jumped(ctx: FaultContext) -> Outcome:
    return _run(ctx, "clock jumps back and ahead", jump_clock, clock=True)


def _publisher_lock_holder(rig: Rig) -> str | None:
    from pin_orchestration.chessboard.outbox.publisher import LOCK_KEY

    with rig.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT holder FROM pin.distributed_locks "
                "WHERE lock_key = :k AND expires_at > now()"
            ),
            {"k": LOCK_KEY},
        ).scalar()


def hang_postgres(rig: Rig, outcome: Outcome) -> None:
    """A drain and the publisher holding the lock reach PostgreSQL through a proxy that is
    blackholed (a hung server or network: no answer, no reset); a publisher that reaches
    it directly takes the lock over after the TTL, the direct drains go on; then the
    network heals and the hung ones' held statements arrive — the stale publisher's
    mark-published is fenced — and the requests and events all get through."""
    from faults.postgres import database_url_via
    from faults.proxy import FaultProxy

    direct_url = rig.url
    with FaultProxy(*rig.ctx.postgres.tcp_address) as proxy:
        for _ in range(rig.ctx.scale(1, 3)):
            _pause(rig)
            for publisher in rig.alive(rig.publishers):
                rig.ctx.sigkill(publisher)
            rig.url = database_url_via(direct_url, proxy)
            rig.spawn_drain()
            rig.spawn_publisher()
            rig.url = direct_url
            cut_off = f"faults-publisher-{rig.publishers[-1].pid}"
            wait_until(
                lambda cut_off=cut_off: _publisher_lock_holder(rig) == cut_off,
                timeout=30,
                what="the publisher behind the proxy took the lock",
            )
            fault_at = rig.db_now()
            pending = rig.unpublished_ids()
            proxy.set_mode("hang")
            outcome.faults_injected += 1
            rig.spawn_publisher()
            rig.recovered_when_drained(outcome, fault_at, "the requests due at the hang drained")
            rig.recovered_when_published(outcome, pending, "the events pending at the hang")
            proxy.set_mode("pass")
        for child in rig.alive(rig.drains) + rig.alive(rig.publishers):
            if child.args and database_url_via(direct_url, proxy) in child.args:
                rig.ctx.sigkill(child)  # before its proxy goes away


@scenario("recalc-pg-hang", job="recalc", fault="PostgreSQL hangs (blackholed)")
def database_hung(ctx: FaultContext) -> Outcome:
    return _run(ctx, "PostgreSQL hangs (blackholed)", hang_postgres)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if sys.argv[1] == "drain":
        run_drain(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        run_publish(sys.argv[2], sys.argv[3], float(sys.argv[4]))
