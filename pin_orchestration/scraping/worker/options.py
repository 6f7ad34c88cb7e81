"""A worker run's options: what Dagster's run config and `pin scraping work` let an
operator set, the deployment's settings for what they leave empty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pin_orchestration.platform.options import option, same_as, with_settings
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.leases import DomainDefaults


class WorkerConfigError(ValueError):
    """A worker option out of range (names the option)."""


# What a worker run (Dagster config) and `pin scraping work` let an operator set.
WORKER_RUN_OPTIONS = ("slots", "idle_exit_seconds", "max_run_duration_seconds")


@dataclass(frozen=True)
class WorkerOptions:
    """One worker run's options; the deployment's settings among them (`same_as`) are
    declared in ScrapingSettings, so a run that leaves them empty takes the variables'."""

    slots: int = same_as(ScrapingSettings, "slots")
    lease_seconds: float = same_as(ScrapingSettings, "lease_seconds")
    idle_exit_seconds: float = option(5.0, "End the run after this long with nothing claimable")
    max_run_duration_seconds: float = option(
        600.0, "Stop claiming after this long; jobs in flight finish"
    )
    poll_seconds: float = option(
        0.2, "How long the loop waits for a slot to finish before looking for new due jobs"
    )
    # Limits of a domain without an override.
    domain_rps: float = same_as(ScrapingSettings, "domain_rps")
    domain_concurrency: int = same_as(ScrapingSettings, "domain_concurrency")
    # robots.txt (scraping/fetch/robots.py)
    robots: str = same_as(ScrapingSettings, "robots")
    robots_retry_seconds: float = same_as(ScrapingSettings, "robots_retry_seconds")

    @classmethod
    def from_settings(cls, settings: ScrapingSettings, **given: Any) -> WorkerOptions:
        """The options given, the deployment's settings for those not given (or None)."""
        return with_settings(cls, settings, **given)

    @property
    def domain_defaults(self) -> DomainDefaults:
        return DomainDefaults(rps=self.domain_rps, concurrency=self.domain_concurrency)

    def validate(self) -> None:
        for name in (
            "slots",
            "lease_seconds",
            "idle_exit_seconds",
            "max_run_duration_seconds",
            "poll_seconds",
            "domain_rps",
            "domain_concurrency",
            "robots_retry_seconds",
        ):
            if not getattr(self, name) > 0:
                raise WorkerConfigError(f"{name} must be > 0 (got {getattr(self, name)!r})")
        if self.robots not in ("obey", "ignore"):
            raise WorkerConfigError(f"robots must be obey or ignore (got {self.robots!r})")
