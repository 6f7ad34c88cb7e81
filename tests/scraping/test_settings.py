"""Scraping configuration from the environment: defaults, fractions, errors naming the
variable."""

from __future__ import annotations

import ipaddress

import pytest

from pin_orchestration.platform.settings import SettingsError
from pin_orchestration.scraping.settings import ScrapingSettings


def test_defaults_are_the_issues() -> None:
    s = ScrapingSettings.from_env({})
    assert (s.slots, s.fetch_timeout_seconds, s.max_attempts) == (64, 30.0, 5)
    assert (s.backoff_base_seconds, s.backoff_cap_seconds, s.lease_seconds) == (2.0, 600.0, 60.0)
    assert s.allowed_cidrs == () and s.max_result_bytes == 50 * 1024 * 1024
    assert s.s3_bucket is None and s.result_url_ttl_seconds == 900.0
    assert s.redis_url is None and s.result_retention_days == 30.0


def test_durations_accept_fractions_and_cidrs_a_list() -> None:
    s = ScrapingSettings.from_env(
        {
            "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS": "0.2",
            "PIN_SCRAPING_LEASE_SECONDS": "1.5",
            "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32, ::1/128",
        }
    )
    assert (s.fetch_timeout_seconds, s.lease_seconds) == (0.2, 1.5)
    assert s.allowed_cidrs == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )


@pytest.mark.parametrize(
    "name,value",
    [
        ("PIN_SCRAPING_SLOTS", "many"),
        ("PIN_SCRAPING_SLOTS", "0"),
        ("PIN_SCRAPING_FETCH_TIMEOUT_SECONDS", "-1"),
        ("PIN_SCRAPING_LEASE_SECONDS", "nan"),
        ("PIN_SCRAPING_MAX_ATTEMPTS", "2.5"),
        ("PIN_SCRAPING_ALLOWED_CIDRS", "127.0.0.1/33"),
        ("PIN_SCRAPING_MAX_RESULT_BYTES", "1e9"),
        ("PIN_S3_ENDPOINT_URL", "minio:9000"),
        ("PIN_RESULT_URL_TTL_SECONDS", "forever"),
        ("PIN_REDIS_URL", "127.0.0.1:6379"),
        ("PIN_RESULT_RETENTION_DAYS", "0"),
        ("PIN_WEBHOOK_TIMEOUT_SECONDS", "soon"),
        ("PIN_WEBHOOK_MAX_ATTEMPTS", "-3"),
        ("PIN_WEBHOOK_BACKOFF_BASE_SECONDS", "inf"),
        ("PIN_WEBHOOK_BACKOFF_CAP_SECONDS", "0"),
        ("PIN_WEBHOOK_SECRET_OVERLAP_SECONDS", "-1"),
        ("PIN_WEBHOOK_SECRET_OVERLAP_SECONDS", "a day"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        ScrapingSettings.from_env({name: value})
