from __future__ import annotations

from dagster import ConfigurableResource

from pin_orchestration.scraping.fetch.client import Fetcher
from pin_orchestration.scraping.policies import (
    fetch_policy_from,
    retry_policy_from,
    webhook_fetch_policy_from,
    webhook_policy_from,
)
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
