from __future__ import annotations

from dagster import ConfigurableResource

from pin_orchestration.scraping.fetch.client import Fetcher, FetchPolicy
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.store.local import result_store_from
from pin_orchestration.scraping.store.results import ResultStore
from pin_orchestration.scraping.webhooks.options import WebhookPolicy
from pin_orchestration.scraping.worker.retry import RetryPolicy


class ScrapingResource(ConfigurableResource):
    """The scraping service's environment: results store, fetch policy, retry policy.

    Everything comes from PIN_SCRAPING_* / PIN_S3_* / PIN_RESULT_URL_TTL_SECONDS, read when
    a run asks (never at import), so a bad value fails the run naming the variable.
    """

    def get_settings(self) -> ScrapingSettings:
        return ScrapingSettings.from_env()

    def get_result_store(self, settings: ScrapingSettings | None = None) -> ResultStore:
        return result_store_from(settings or self.get_settings())

    def get_fetcher(self, settings: ScrapingSettings | None = None) -> Fetcher:
        return Fetcher(fetch_policy_from(settings or self.get_settings()))

    def get_webhook_fetcher(self, settings: ScrapingSettings | None = None) -> Fetcher:
        return Fetcher(webhook_fetch_policy_from(settings or self.get_settings()))

    def get_webhook_policy(self, settings: ScrapingSettings | None = None) -> WebhookPolicy:
        return webhook_policy_from(settings or self.get_settings())

    def get_retry_policy(self, settings: ScrapingSettings | None = None) -> RetryPolicy:
        return retry_policy_from(settings or self.get_settings())


def fetch_policy_from(settings: ScrapingSettings) -> FetchPolicy:
    return FetchPolicy(
        timeout_seconds=settings.fetch_timeout_seconds,
        max_body_bytes=settings.max_result_bytes,
        allowed_cidrs=settings.allowed_cidrs,
        user_agent=settings.user_agent,
    )


def retry_policy_from(settings: ScrapingSettings) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=settings.max_attempts,
        backoff_base_seconds=settings.backoff_base_seconds,
        backoff_cap_seconds=settings.backoff_cap_seconds,
        max_pause_seconds=settings.max_pause_seconds,
    )


# A receiver's answer is only read for its status: its body is cut short.
WEBHOOK_ANSWER_MAX_BYTES = 64 * 1024


def webhook_fetch_policy_from(settings: ScrapingSettings) -> FetchPolicy:
    """The scraper's SSRF policy (same allow-list) with the webhook's timeout."""
    return FetchPolicy(
        timeout_seconds=settings.webhook_timeout_seconds,
        max_body_bytes=WEBHOOK_ANSWER_MAX_BYTES,
        allowed_cidrs=settings.allowed_cidrs,
    )


def webhook_policy_from(settings: ScrapingSettings) -> WebhookPolicy:
    return WebhookPolicy(
        max_attempts=settings.webhook_max_attempts,
        backoff_base_seconds=settings.webhook_backoff_base_seconds,
        backoff_cap_seconds=settings.webhook_backoff_cap_seconds,
        timeout_seconds=settings.webhook_timeout_seconds,
        secret_overlap_seconds=settings.webhook_secret_overlap_seconds,
    )
