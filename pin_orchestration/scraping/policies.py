"""The policies a worker, the webhook sender and the API take, built from the settings: one
place for what each setting means to them (the Dagster resource and `pin scraping work`
both build them here)."""

from __future__ import annotations

from pin_orchestration.scraping.fetch.client import FetchPolicy
from pin_orchestration.scraping.settings import ScrapingSettings
from pin_orchestration.scraping.webhooks.options import WebhookPolicy
from pin_orchestration.scraping.worker.retry import RetryPolicy


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
    """The scraper's SSRF policy (same allow-list) and User-Agent with the webhook's
    timeout: a receiver knows the service by the name its targets see."""
    return FetchPolicy(
        timeout_seconds=settings.webhook_timeout_seconds,
        max_body_bytes=WEBHOOK_ANSWER_MAX_BYTES,
        allowed_cidrs=settings.allowed_cidrs,
        user_agent=settings.user_agent,
    )


def webhook_policy_from(settings: ScrapingSettings) -> WebhookPolicy:
    return WebhookPolicy(
        max_attempts=settings.webhook_max_attempts,
        backoff_base_seconds=settings.webhook_backoff_base_seconds,
        backoff_cap_seconds=settings.webhook_backoff_cap_seconds,
        timeout_seconds=settings.webhook_timeout_seconds,
        secret_overlap_seconds=settings.webhook_secret_overlap_seconds,
    )
