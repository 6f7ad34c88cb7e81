"""What a webhook delivery run is told: the deployment's delivery policy (attempts, backoff,
leases, secret rotation) and one run's options (batch, slots, tenant share, duration)."""

from __future__ import annotations

from dataclasses import dataclass

from pin_orchestration.platform.options import option
from pin_orchestration.scraping.worker.retry import RetryPolicy


class WebhookConfigError(ValueError):
    """The delivery loop's options are invalid; raised before any work."""


@dataclass(frozen=True)
class WebhookPolicy:
    max_attempts: int = 8
    backoff_base_seconds: float = 5.0
    backoff_cap_seconds: float = 3600.0
    # Timeout of one delivery (connect, read and the whole call).
    timeout_seconds: float = 10.0
    # After a rotation, deliveries carry the replaced secret's signature this long too.
    secret_overlap_seconds: float = 86400.0

    def validate(self) -> None:
        problems = [
            f"{name} must be > 0 (got {getattr(self, name)})"
            for name in (
                "max_attempts",
                "backoff_base_seconds",
                "backoff_cap_seconds",
                "timeout_seconds",
            )
            if not getattr(self, name) > 0
        ]
        if not self.secret_overlap_seconds >= 0:
            problems.append(
                f"secret_overlap_seconds must be >= 0 (got {self.secret_overlap_seconds})"
            )
        if problems:
            raise WebhookConfigError("invalid webhook delivery policy: " + "; ".join(problems))

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_cap_seconds=self.backoff_cap_seconds,
        )

    @property
    def lease_seconds(self) -> float:
        # The claim must outlive the call (the Fetcher's deadline) and the recording; a
        # delivery is claimed only when a slot sends it at once, so one call is all it spans.
        return 2 * self.timeout_seconds + 30


@dataclass(frozen=True)
class DeliveryOptions:
    batch_size: int = option(
        50,
        "Deliveries claimed per round at most (one short transaction; never more than "
        "the free slots)",
    )
    concurrency: int = option(8, "Deliveries in flight at once")
    per_tenant: int = option(
        4,
        "Deliveries of one tenant in flight at once (at most `concurrency`, and one "
        "slot short of it when there are more than one): the other slots stay free for "
        "the other tenants while one tenant's receiver hangs",
    )
    max_run_duration_seconds: float = option(
        240.0, "Stop claiming after this long; the sensor launches the next run"
    )

    @property
    def tenant_share(self) -> int:
        """The slots one tenant may hold: `per_tenant`, but one short of them all when
        there are more than one, so a tenant whose receiver hangs never holds every slot
        (per_tenant == concurrency let it: the other tenants waited for its timeouts)."""
        if self.concurrency <= 1:
            return self.per_tenant
        return min(self.per_tenant, self.concurrency - 1)

    def validate(self) -> None:
        problems = [
            f"{name} must be > 0 (got {getattr(self, name)})"
            for name in ("batch_size", "concurrency", "per_tenant", "max_run_duration_seconds")
            if not getattr(self, name) > 0
        ]
        if self.per_tenant > self.concurrency:
            problems.append(
                f"per_tenant must be <= concurrency ({self.concurrency}) (got {self.per_tenant})"
            )
        if problems:
            raise WebhookConfigError("invalid webhook delivery options: " + "; ".join(problems))


# --- the wire format ---------------------------------------------------------------------
