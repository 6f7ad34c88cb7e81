"""Load the whole code location and pin down every name in it.

An accidental rename of an asset, check, job, schedule or sensor breaks operators'
bookmarks, backfills and alert routing, and a renamed op breaks saved run config (`ops:
{name: ...}`): `definitions_snapshot.json` holds every one of them, committed beside this
file, so a rename shows up in review as a diff of that file. So does a change of what
decides lateness and blocking: each asset's freshness policy and each blocking check.

Naming rule (names are operator contracts: never renamed to follow it, only new ones): a
job, schedule or sensor starts with its area — `news_`, `chessboard_`, `scraping_`, or
`pin_` for the platform-wide ones (pin_retention, pin_alert_checks, pin_release_lock); an
asset's key starts with its area (`news/`, `chessboard/`, `scraping/`).

After an intended change, regenerate the snapshot and commit it with the change:

    python -m tests.test_definitions --write
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

from dagster import AssetKey, OpDefinition, TimeWindowPartitionsDefinition
from dagster._core.definitions.freshness import (
    CronFreshnessPolicy,
    FreshnessPolicy,
    TimeWindowFreshnessPolicy,
)

from pin_orchestration.definitions import build_definitions
from pin_orchestration.platform.settings import Settings

SNAPSHOT = Path(__file__).with_name("definitions_snapshot.json")
REGENERATE = "python -m tests.test_definitions --write"
AREAS = ("news_", "chessboard_", "scraping_", "pin_")
ASSET_AREAS = ("news/", "chessboard/", "scraping/")
# Named before the rule; a contract like every other name, so it keeps its name.
OLDER_THAN_THE_RULE = {"record_failed_runs"}


def _repository():
    # The defaults, not this shell's environment (PIN_NEWS_FULL_SWEEP_CRON sets a cron).
    return build_definitions(Settings.from_env({})).get_repository_def()


def _named_jobs(repo) -> list:
    return sorted(
        (j for j in repo.get_all_jobs() if not j.name.startswith("__")), key=lambda j: j.name
    )


def sorted_nodes(job) -> list:
    return sorted(job.graph.nodes, key=lambda node: node.name)


def freshness(policy: FreshnessPolicy) -> dict[str, str | None]:
    """A freshness policy as the UI explains it: a deadline, or a window to have
    materialized in."""
    if isinstance(policy, CronFreshnessPolicy):
        return {
            "deadline_cron": policy.deadline_cron,
            "timezone": policy.timezone,
            "materialized_within_before_deadline": str(policy.lower_bound_delta),
        }
    if isinstance(policy, TimeWindowFreshnessPolicy):
        return {
            "fail_window": str(policy.fail_window.to_timedelta()),
            "warn_window": str(policy.warn_window.to_timedelta()) if policy.warn_window else None,
        }
    raise AssertionError(f"render {type(policy).__name__} here")


def definitions_snapshot() -> dict[str, list]:
    """Every name of the code location, sorted: what operators and saved config rely on."""
    repo = _repository()
    graph = repo.asset_graph
    return {
        "assets": sorted(key.to_user_string() for key in graph.get_all_asset_keys()),
        "asset_checks": sorted(
            f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys
        ),
        # A failed blocking check stops what is built from its asset (docs/analysts.md).
        "blocking_checks": sorted(
            f"{key.asset_key.to_user_string()}:{key.name}"
            for key in graph.asset_check_keys
            if graph.get(key).blocking
        ),
        # When the UI shows an asset as late (Dagster's freshness daemon).
        "freshness_policies": sorted(
            (
                {"asset": key.to_user_string(), **freshness(graph.get(key).freshness_policy)}
                for key in graph.get_all_asset_keys()
                if graph.get(key).freshness_policy is not None
            ),
            key=lambda f: f["asset"],
        ),
        "jobs": [j.name for j in _named_jobs(repo)],
        # The keys of run config (`ops: {name: {config: ...}}`), as `job:op`.
        "ops": [f"{j.name}:{node.name}" for j in _named_jobs(repo) for node in sorted_nodes(j)],
        "schedules": sorted(
            (
                {
                    "name": s.name,
                    "cron": s.cron_schedule,
                    "timezone": s.execution_timezone,
                    "default_status": s.default_status.value,
                    "job": s.job_name,
                }
                for s in repo.schedule_defs
            ),
            key=lambda s: s["name"],
        ),
        "sensors": sorted(
            (
                {
                    "name": s.name,
                    "default_status": s.default_status.value,
                    "jobs": sorted(t.job_name for t in s.targets),
                    "assets": sorted(k.to_user_string() for k in s.asset_selection.resolve(graph))
                    if s.asset_selection is not None
                    else [],
                }
                for s in repo.sensor_defs
            ),
            key=lambda s: s["name"],
        ),
    }


def render(snapshot: dict[str, list]) -> str:
    """JSON with one item a line, so a rename is a one-line diff."""
    sections = []
    for section, items in snapshot.items():
        lines = ",\n".join(f"    {json.dumps(item)}" for item in items)
        sections.append(f"  {json.dumps(section)}: [\n{lines}\n  ]")
    return "{\n" + ",\n".join(sections) + "\n}\n"


def test_code_location_matches_the_committed_snapshot() -> None:
    """Every name is a contract and kept as it is. Areas: news, chessboard, scraping, and pin
    for what spans them (pin_retention, pin_alert_checks, pin_release_lock); a new job,
    schedule or sensor starts with its area (`news_`, `chessboard_`, `scraping_`, `pin_`)
    and an asset key with its area's prefix (`news/`, ...). Regenerate after an intended
    change: `python -m tests.test_definitions --write`."""
    expected = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    actual = render(definitions_snapshot())
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"{SNAPSHOT.name} (committed)",
                tofile="the code location now",
            )
        )
        raise AssertionError(
            "The code location's names differ from tests/definitions_snapshot.json. A rename "
            "breaks operators' bookmarks, run config and alert routing; if the change is "
            f"intended, run `{REGENERATE}` and commit the file.\n{diff}"
        )


def test_names_start_with_their_area() -> None:
    snapshot = definitions_snapshot()
    named = [
        *snapshot["jobs"],
        *(s["name"] for s in snapshot["schedules"]),
        *(s["name"] for s in snapshot["sensors"]),
    ]
    assert [n for n in named if not n.startswith(AREAS) and n not in OLDER_THAN_THE_RULE] == []
    assert [a for a in snapshot["assets"] if not a.startswith(ASSET_AREAS)] == []


def test_op_functions_are_named_as_their_ops() -> None:
    """`queue_forced_recalcs` the op is `queue_forced_recalcs` the function (STYLE.md)."""
    differ = set()
    # Op jobs only: an asset's op is named after its key.
    for j in _named_jobs(_repository()):
        if list(j.asset_layer.executable_asset_keys):
            continue
        for node in j.graph.iterate_node_defs():
            if not isinstance(node, OpDefinition):
                continue  # the job's own graph
            fn = node.compute_fn.decorated_fn
            if fn.__name__ != node.name:
                differ.add(f"op {node.name}: def {fn.__name__}")
    assert sorted(differ) == []


def test_each_daily_asset_shows_a_late_day_by_its_freshness_policy() -> None:
    """Every daily asset a run builds declares when its day is late, the reconcile's (and
    its drift frame's) an hour after the 03:00 schedule that builds it."""
    repo = _repository()
    graph = repo.asset_graph
    daily = [
        key
        for key in graph.get_all_asset_keys()
        if graph.get(key).is_executable
        and isinstance(graph.get(key).partitions_def, TimeWindowPartitionsDefinition)
    ]
    assert {key.to_user_string() for key in daily} == {
        "news/post_comment_counts",
        "news/daily_drift_by_post_status",
        "scraping/daily_outcomes",
    }
    assert [k for k in daily if graph.get(k).freshness_policy is None] == []
    schedule = repo.get_schedule_def("news_comment_reconcile_daily")
    minute, hour = schedule.cron_schedule.split()[:2]
    for key in ("news/post_comment_counts", "news/daily_drift_by_post_status"):
        policy = graph.get(AssetKey.from_user_string(key)).freshness_policy
        assert isinstance(policy, CronFreshnessPolicy)
        deadline_minute, deadline_hour = policy.deadline_cron.split()[:2]
        assert policy.timezone == schedule.execution_timezone
        assert (deadline_minute, int(deadline_hour)) == (minute, int(hour) + 1)
        assert policy.lower_bound_delta.total_seconds() == 3600


def test_reconcile_asset_is_daily_partitioned_in_moscow() -> None:
    repo = build_definitions().get_repository_def()
    asset = repo.assets_defs_by_key[
        next(k for k in repo.assets_defs_by_key if k.to_user_string() == "news/post_comment_counts")
    ]
    partitions = asset.partitions_def
    assert partitions.timezone == "Europe/Moscow"
    assert partitions.get_partition_keys()[0] == "2025-01-01"


def test_loading_the_module_reads_no_environment(monkeypatch) -> None:
    """The environment is read when Dagster builds the code location, not on import: a bad
    variable must not break `import pin_orchestration.definitions` (tests, tools)."""
    import importlib

    import pin_orchestration.definitions as module

    monkeypatch.setenv("PIN_NEWS_FULL_SWEEP_CRON", "not a cron")
    importlib.reload(module)
    from pin_orchestration.platform.settings import SettingsError

    try:
        module.defs()
    except SettingsError as exc:
        assert "PIN_NEWS_FULL_SWEEP_CRON" in str(exc)
    else:
        raise AssertionError("a bad cron must be refused when the location is built")


def test_backfills_and_automation_runs_cost_one_process_and_yield_to_operators() -> None:
    """UI backfills and automation launch runs of the implicit asset job: in-process like
    the named jobs (one Python start per run, not one more per step), and the analysts'
    derived runs queue behind an operator's backfill, a few at a time (dagster.yaml)."""
    import yaml
    from dagster import in_process_executor

    from pin_orchestration.sensors.analyst import pin_analyst_automation

    repo = build_definitions().get_repository_def()
    implicit = next(j for j in repo.get_all_jobs() if j.name.startswith("__ASSET_JOB"))
    assert implicit.executor_def is in_process_executor

    assert int(pin_analyst_automation.run_tags["dagster/priority"]) < 0
    limits = yaml.safe_load((Path(__file__).parent.parent / "dagster.yaml").read_text())[
        "concurrency"
    ]["runs"]["tag_concurrency_limits"]
    assert {"key": "dagster/sensor_name", "value": "pin_analyst_automation", "limit": 2} in limits


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    SNAPSHOT.write_text(render(definitions_snapshot()))
    print(f"wrote {SNAPSHOT}")
