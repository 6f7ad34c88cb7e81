"""`pin scraping work` builds its policies in scraping/policies.py without loading Dagster;
the Dagster worker run builds them through ScrapingResource. On generated settings (seeded)
and run options, both hand run_worker the same options, fetch policy and retry policy, and
the resource's webhook policies are the module's."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from dagster import DagsterInstance
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from pin_orchestration.cli import main as cli
from pin_orchestration.jobs import scraping as scraping_jobs
from pin_orchestration.jobs.scraping import scraping_worker
from pin_orchestration.resources.database import DatabaseResource
from pin_orchestration.resources.scraping import ScrapingResource
from pin_orchestration.scraping import policies
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.worker import run as worker_run
from pin_orchestration.scraping.worker.outcomes import WorkerReport

seconds = st.floats(0.5, 600, allow_nan=False).map(lambda s: f"{s:.3f}")
environments = st.fixed_dictionaries(
    {},
    optional={
        "PIN_SCRAPING_SLOTS": st.integers(1, 600).map(str),
        "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": seconds,
        "PIN_SCRAPING_MAX_ATTEMPTS": st.integers(1, 20).map(str),
        "PIN_SCRAPING_BACKOFF_BASE_SECONDS": seconds,
        "PIN_SCRAPING_BACKOFF_CAP_SECONDS": st.floats(600, 7200).map(lambda s: f"{s:.1f}"),
        "PIN_SCRAPING_LEASE_SECONDS": seconds,
        "PIN_SCRAPING_ALLOWED_CIDRS": st.sampled_from(
            ["127.0.0.1/32", "127.0.0.0/8,::1/128", "10.0.0.0/8, 192.168.0.0/16", ""]
        ),
        "PIN_SCRAPING_MAX_RESULT_BYTES": st.integers(1, 10**9).map(str),
        "PIN_SCRAPING_DOMAIN_RPS": st.floats(0.01, 1000).map(lambda r: f"{r:.3f}"),
        "PIN_SCRAPING_DOMAIN_CONCURRENCY": st.integers(1, 100).map(str),
        "PIN_SCRAPING_ROBOTS": st.sampled_from(["obey", "ignore"]),
        "PIN_SCRAPING_ROBOTS_RETRY_SECONDS": seconds,
        "PIN_SCRAPING_USER_AGENT": st.sampled_from(
            ["pin-scraper/0.2 (+https://example.org/bot)", "Other_bot", "x-y/1"]
        ),
        "PIN_WEBHOOK_TIMEOUT_SECONDS": seconds,
        "PIN_WEBHOOK_MAX_ATTEMPTS": st.integers(1, 20).map(str),
    },
)
run_options = st.fixed_dictionaries(
    {},
    optional={
        "slots": st.integers(1, 600),
        "idle_exit_seconds": st.floats(0.1, 60).map(lambda s: round(s, 3)),
        "max_run_duration_seconds": st.floats(1, 3600).map(lambda s: round(s, 3)),
    },
)


def captured_run(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[Any, ...]]:
    """What run_worker is given, as `module` calls it; it claims nothing."""
    calls: list[tuple[Any, ...]] = []

    def run_worker(engine: Any, store: Any, fetcher: Any, retry: Any, options: Any, **kw: Any):
        calls.append((options, fetcher.policy, retry))
        return WorkerReport(worker=kw["worker_id"])

    monkeypatch.setattr(module, "run_worker", run_worker)
    return calls


@seed(20261204)
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(environment=environments, given_options=run_options)
def test_pin_scraping_work_and_the_dagster_run_build_the_same_worker(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    environment: dict[str, str],
    given_options: dict[str, Any],
) -> None:
    home = tmp_path_factory.mktemp("home")
    with monkeypatch.context() as patched:
        for name in list(ScrapingSettings.from_env({}).__dict__):
            patched.delenv(f"PIN_SCRAPING_{name.upper()}", raising=False)
        patched.setenv("PIN_HOME", str(home))
        patched.setenv("PIN_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/none")
        for name, value in environment.items():
            patched.setenv(name, value)
        from_settings = ScrapingSettings.from_env()

        by_cli = captured_run(patched, worker_run)
        arguments = ["scraping", "work"]
        for name, value in given_options.items():
            arguments += [f"--{name.replace('_', '-')}", str(value)]
        answer = CliRunner().invoke(cli, arguments, catch_exceptions=False)
        assert answer.exit_code == 0, answer.output

        by_dagster = captured_run(patched, scraping_jobs)
        with DagsterInstance.ephemeral() as instance:
            result = scraping_worker.execute_in_process(
                instance=instance,
                resources={
                    "database": DatabaseResource(url="postgresql+psycopg://x@127.0.0.1:1/x"),
                    "scraping": ScrapingResource(),
                },
                run_config={"ops": {"drain_scraping_jobs": {"config": given_options}}},
            )
        assert result.success

        assert len(by_cli) == 1
        assert by_cli == by_dagster
        resource = ScrapingResource()
        assert resource.get_webhook_policy() == policies.webhook_policy_from(from_settings)
        fetcher = resource.get_webhook_fetcher()
        try:
            assert fetcher.policy == policies.webhook_fetch_policy_from(from_settings)
        finally:
            fetcher.close()
